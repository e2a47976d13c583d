/* compile.c — kiln_compile: a build from the model's text to the program's code in one
 * call. The file is read and parsed once; each graph the program needs is lowered once,
 * run through the pipeline once and planned once (the pipeline's fusion and memplan
 * stages), and the code generators and reports read those plans. The only graphs planned
 * more than once are the memory budget search's candidates, which --time-passes counts. */
#include "kiln.h"

#include <stdlib.h>
#include <string.h>

/* A build in progress: the options and the program being filled. */
typedef struct {
    const KilnOptions *opt;
    KilnProgram *p;
    StrBuf *err;
    const char *cmd;
    const char *precision_from; /* "precision =" or "--precision" */
    bool unfused;               /* this run: attention as written (the report's comparison) */
} Build;

static void stage(const Build *b, const char *what)
{
    if (b->opt->progress) b->opt->progress(b->opt->progress_ctx, what);
}

/* The time of a frontend stage, as a row of --time-passes. */
static void time_row(const Build *b, const char *what, const char *graph, double t0, const Graph *g, const char *note)
{
    if (!b->opt->time_passes) return;
    const int32_t n = g ? g->nnodes : 0;
    pipeline_time_row(&b->p->timing, what, graph, pipeline_seconds() - t0, 0, n, note);
}

/* Lowers symbol bounds ("T=64") in a graph: memory is planned for the new bound. */
static int apply_bounds(const Build *b, Graph *g)
{
    for (int i = 0; i < b->opt->nbounds; i++) {
        const char *bound = b->opt->bounds[i], *eq = strchr(bound, '=');
        if (!eq) {
            sb_printf(b->err, "kiln: error: --bound %s: give NAME=N", bound);
            return -1;
        }
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)(eq - bound), bound);
        int s = ir_find_symbol(g, name);
        char *end;
        long long v = strtoll(eq + 1, &end, 10);
        if (s < 0) {
            sb_printf(b->err, "kiln: error: --bound %s: the model has no size '%s'", bound, name);
            return -1;
        }
        if (*end || v < 1 || v > g->syms[s].max) {
            sb_printf(b->err, "kiln: error: --bound %s: must be between 1 and %s's bound %lld", bound, name, (long long)g->syms[s].max);
            return -1;
        }
        g->syms[s].max = v;
    }
    return 0;
}

/* Whether attention stays as written (--attention unfused). A decode graph's attention over
 * the key/value cache is fused too: the kernel reads the time-major cache in place, and the
 * causal mask relative to the past as a broadcast. */
static bool unfused_attention(const KilnOptions *opt) { return opt->unfused_attention; }

/* The largest head size the target's fused kernels take (0: any): the CUDA target's keep
 * a tile of 32 keys by 128 columns in shared memory (runtime/cuda/kiln_cuda_attention.h). */
static int64_t attention_max_head(const KilnOptions *opt) { return opt->target == KILN_TARGET_CUDA ? 128 : 0; }

/* Runs the pipeline on one graph of the program (from the pass after `from` to the end,
 * or up to `after`), timed as that graph's. */
static int run(const Build *b, Graph *g, const char *graph_name, const char *from, const char *after, bool forward_only,
               RematOptions *remat, GraphPlan *plan)
{
    PipelineOptions po = {.remat = remat,
                          .precision = forward_only ? NULL : &b->p->precision,
                          .unfused_attention = b->unfused || unfused_attention(b->opt),
                          .attention_max_head = attention_max_head(b->opt),
                          .from = from,
                          .forward_only = forward_only,
                          .plan = plan,
                          .times = b->opt->time_passes ? &b->p->timing : NULL,
                          .graph_name = graph_name};
    return pipeline_run_opts(g, after, &po, NULL, b->err);
}

/* The precision of the build: --precision when given, else the recipe's; then fp16's loss
 * scaling and the rounding of bf16's weight copies. 0, or -1 after the message (the
 * recipe check refused loss scaling keys that do nothing under the recipe's own precision;
 * the same keys under a --precision that is not fp16 are refused here). */
static int set_precision(Build *b)
{
    KilnProgram *p = b->p;
    const Recipe *r = &p->model->recipe;
    const bool training = p->train.graph->mode == MODE_TRAIN && !b->opt->infer;
    const RecipeValue *prec = recipe_get(r, "precision");
    const char *name = b->opt->precision ? b->opt->precision : prec && prec->str ? prec->str : "fp32";
    b->precision_from = b->opt->precision ? "--precision" : "precision =";
    const int t = recipe_precision_dtype(name);
    p->precision.half = t < 0 ? DT_F32 : (DType)t;
    if (b->opt->infer && b->opt->precision && p->precision.half != DT_F32) { /* a flag that would change nothing: an error */
        sb_printf(b->err, "kiln %s: error: --precision %s applies to training; inference programs (--infer, --lib) run in fp32", b->cmd,
                  b->opt->precision);
        return -1;
    }
    const RecipeValue *scale = recipe_get(r, "loss_scale"), *init = recipe_get(r, "loss_scale_init"),
                      *interval = recipe_get(r, "loss_scale_growth_interval");
    const bool none = scale && scale->kind == RV_NAME && !strcmp(scale->str, "none");
    if (p->precision.half != DT_F16) {
        const RecipeValue *extra = scale && !none ? scale : init ? init : interval;
        if (extra) {
            sb_printf(b->err, "kiln %s: error: %s %s: the recipe's %s (line %u) applies to fp16 training only (give --precision fp16, or "
                              "remove it from the recipe)", b->cmd, b->precision_from, kiln_precision_name(p->precision.half), extra->key,
                      extra->loc.line);
            return -1;
        }
    } else if (!none && training) {
        p->precision.scale_loss = true; /* as the recipe's loss_scale says, from the table's defaults (kiln_recipe.h) */
    }
    const RecipeValue *rounding = recipe_get(r, "weight_rounding");
    const char *how = b->opt->weight_rounding ? b->opt->weight_rounding : rounding && rounding->str ? rounding->str : "nearest";
    if (!strcmp(how, "stochastic")) {
        if (p->precision.half != DT_BF16) {
            sb_printf(b->err, "kiln %s: error: %s stochastic applies to bf16 training only; %s %s has no half-precision weights to round "
                              "that way (give --precision bf16, or round to nearest)", b->cmd,
                      b->opt->weight_rounding ? "--weight-rounding" : "weight_rounding =", b->precision_from,
                      kiln_precision_name(p->precision.half));
            return -1;
        }
        p->precision.stochastic_weights = training;
    }
    return 0;
}

/* Identifies the model's computation for checkpoints and distributed ranks: the training
 * graph as lowered (its bounds applied), without source locations, and the precision it
 * trains in. Editing comments, building from another directory, for the other target, with
 * or without fused attention or a memory budget keeps checkpoints usable: the passes do not
 * change what is computed. */
static uint64_t model_hash(const Graph *g, const PrecisionOptions *prec)
{
    char extra[96];
    snprintf(extra, sizeof extra, "precision %s%s%s\n", ir_dtype_name(prec->half), prec->scale_loss ? " loss_scale" : "",
             prec->stochastic_weights ? " stochastic" : "");
    return ir_hash(g, extra);
}

/* Keeps a graph's forward outputs and buffer updates: the predict step of an evaluation
 * graph, the decode step of a decode graph (the pipeline's simplify then drops what only
 * the loss and metrics read). */
static void forward_only(Graph *g)
{
    int32_t n = 0;
    for (int32_t k = 0; k < g->noutputs; k++)
        if (g->outputs[k].kind != OUT_LOSS && g->outputs[k].kind != OUT_METRIC) g->outputs[n++] = g->outputs[k];
    g->noutputs = n;
}

static bool has_recomputed(const Graph *g)
{
    for (NodeId i = 0; i < g->nnodes; i++)
        if ((g->nodes[i].flags & NODE_RECOMPUTED) && g->nodes[i].ckpt) return true; /* not the precision pass's */
    return false;
}

/* The evaluation graph: lowered in eval mode, simplified, bounded and planned. */
static int plan_eval(Build *b)
{
    KilnProgram *p = b->p;
    const double t0 = pipeline_seconds();
    p->eval.graph = frontend_lower(&p->diag, p->model, MODE_EVAL);
    time_row(b, "lower", "eval", t0, p->eval.graph, NULL);
    if (!p->eval.graph) {
        sb_printf(b->err, "%s: error: the model's evaluation graph did not lower", p->model->path);
        return -1;
    }
    if (run(b, p->eval.graph, "eval", NULL, "simplify", true, NULL, NULL) || apply_bounds(b, p->eval.graph)) return -1;
    return run(b, p->eval.graph, "eval", "simplify", NULL, true, NULL, &p->eval.plan);
}

/* The message when the budget cannot be met: with the smallest plan the search reached. */
static void budget_unmet(Build *b, const RematOptions *remat)
{
    const KilnProgram *p = b->p;
    const int64_t budget = p->memory_budget, fixed = budget - remat->arena_budget, least = fixed + remat->smallest_arena;
    const char *file = p->model->path;
    b->err->len = 0;
    b->err->data[0] = 0;
    if (remat->nblocks) {
        StrBuf blocks;
        sb_init(&blocks);
        kiln_checkpointed_blocks(remat->blocks, remat->nblocks, remat->cheap, "", &blocks);
        sb_printf(b->err, "%s: error: %s %lld bytes (%.1f MiB) cannot be met: the smallest plan a budget can reach, %s, "
                          "needs %lld bytes (%.1f MiB) of training memory",
                  file, p->budget_from, (long long)budget, (double)budget / 1048576.0, blocks.data, (long long)least,
                  (double)least / 1048576.0);
        sb_free(&blocks);
    } else
        sb_printf(b->err, "%s: error: %s %lld bytes (%.1f MiB) cannot be met: the model's forward calls none of its "
                          "own modules, so there is no block to checkpoint, and its plan needs %lld bytes (%.1f MiB) of training "
                          "memory (checkpoint(...) in the model file recomputes what it marks)",
                  file, p->budget_from, (long long)budget, (double)budget / 1048576.0, (long long)least, (double)least / 1048576.0);
}

/* The training graph through the pipeline, under the memory budget (--memory-budget,
 * else the recipe's memory_budget) if any, checkpointing blocks until the plan fits; the
 * evaluation step's arena counts against it. Planned unless plan is false (an inference
 * program keeps the training graph for its tables and hash only). */
static int plan_training(Build *b, bool plan)
{
    KilnProgram *p = b->p;
    const char *file = p->model->path;
    Graph *g = p->train.graph;
    const bool report = b->opt->report && !b->opt->infer;
    Graph *unfused = report && !unfused_attention(b->opt) ? ir_graph_clone(g) : NULL;
    p->unfused_arena = -1;
    if (run(b, g, "train", NULL, "precision", false, NULL, NULL)) {
        ir_graph_free(unfused);
        return -1;
    }
    Graph *before_remat = report ? ir_graph_clone(g) : NULL;
    RematOptions remat = {.want_floor = b->opt->smallest_plan && report};
    p->memory_budget = b->opt->memory_budget;
    p->budget_from = "--memory-budget";
    const RecipeValue *budget = recipe_get(&p->model->recipe, "memory_budget");
    if (!p->memory_budget && budget && !b->opt->infer && util_parse_size(budget->str, &p->memory_budget)) p->budget_from = "memory_budget";
    int rc = 0;
    if (p->memory_budget) {
        const int64_t fixed = kiln_slab_bytes(g, &p->model->recipe, NULL, NULL, NULL, NULL) + p->eval.plan.mem.arena_bytes;
        if (fixed >= p->memory_budget) {
            sb_printf(b->err, "%s: error: %s %lld bytes (%.1f MiB) is not more than the parameters, gradients, optimizer "
                              "state, buffers and evaluation activations alone (%lld bytes, %.1f MiB): recomputing activations cannot help",
                      file, p->budget_from, (long long)p->memory_budget, (double)p->memory_budget / 1048576.0, (long long)fixed,
                      (double)fixed / 1048576.0);
            RematOptions floor = {.want_floor = true}; /* and the least a budget can reach */
            StrBuf e2;
            sb_init(&e2);
            Build quiet = *b;
            quiet.err = &e2;
            if (!run(&quiet, g, "train", "precision", "remat", false, &floor, NULL))
                sb_printf(b->err, "; the smallest plan needs %lld bytes (%.1f MiB)", (long long)(fixed + floor.floor_arena),
                          (double)(fixed + floor.floor_arena) / 1048576.0);
            sb_free(&e2);
            ir_graph_free(before_remat);
            return -1;
        }
        remat.arena_budget = p->memory_budget - fixed;
    }
    if (run(b, g, "train", "precision", NULL, false, &remat, plan ? &p->train.plan : NULL)) {
        if (remat.smallest_arena) budget_unmet(b, &remat); /* the budget, not the model: said with the smallest figure */
        rc = -1;
    }
    p->remat = remat;
    if (!rc && p->memory_budget && !remat.nblocks && report) /* nothing to choose from: said, not silently ignored */
        sb_printf(&p->notes, "kiln: %s: the model calls none of its own modules from forward: no block to checkpoint\n", p->budget_from);
    if (!rc && before_remat && has_recomputed(g)) { /* the report compares the plan with the graph without remat */
        p->plain.graph = before_remat;
        before_remat = NULL;
        rc = run(b, p->plain.graph, "plain", "remat", NULL, false, NULL, &p->plain.plan);
    }
    ir_graph_free(before_remat);
    if (!rc && unfused && !p->memory_budget && kiln_fused_attentions(g)) { /* what fusing saved, for the report */
        Build as_written = *b;
        as_written.unfused = true;
        GraphPlan plan_unfused;
        memset(&plan_unfused, 0, sizeof plan_unfused);
        rc = run(&as_written, unfused, "unfused", NULL, NULL, false, NULL, &plan_unfused);
        p->unfused_arena = plan_unfused.mem.arena_bytes;
        graph_plan_free(&plan_unfused);
    }
    ir_graph_free(unfused);
    return rc;
}

/* A language model's decode graph for incremental generation (frontend/decode.c), as the
 * predict graph is made from the eval graph; none for other models, or with the reason in
 * p->decode_why when generation must recompute the whole window for each token. */
static int plan_decode(Build *b)
{
    KilnProgram *p = b->p;
    const RecipeValue *data = recipe_get(&p->model->recipe, "data");
    if (!data || !data->str || (strcmp(data->str, "text") && strcmp(data->str, "tokens"))) return 0;
    const double t0 = pipeline_seconds();
    Graph *g = frontend_lower(&p->diag, p->model, MODE_DECODE);
    time_row(b, "lower", "decode", t0, g, NULL);
    if (!g) { /* the eval graph of the same file lowered: a bug of decode.c, said as one */
        sb_printf(b->err, "%s: internal error: the decode graph did not lower", p->model->path);
        return -1;
    }
    const Graph *train = p->train.graph;
    bool same_syms = g->nsyms >= train->nsyms;
    for (int i = 0; same_syms && i < train->nsyms; i++) same_syms = !strcmp(g->syms[i].name, train->syms[i].name);
    StrBuf why;
    sb_init(&why);
    int rc = 0;
    if (!same_syms) sb_puts(&why, "its sizes are not the model's");
    else if (apply_bounds(b, g)) rc = -1;
    else if (!frontend_decode_check(g, &why)) {
        forward_only(g);
        p->decode.graph = g;
        g = NULL;
        rc = run(b, p->decode.graph, "decode", NULL, NULL, true, NULL, &p->decode.plan);
    }
    if (why.len) p->decode_why = xstrdup(why.data);
    sb_free(&why);
    ir_graph_free(g);
    return rc;
}

/* The predict step of an inference program: the evaluation graph's forward alone. */
static int plan_predict(Build *b)
{
    KilnProgram *p = b->p;
    p->predict.graph = ir_graph_clone(p->eval.graph);
    forward_only(p->predict.graph);
    return run(b, p->predict.graph, "predict", NULL, NULL, true, NULL, &p->predict.plan);
}

static int generate_code(Build *b)
{
    KilnProgram *p = b->p;
    const bool cuda = b->opt->target == KILN_TARGET_CUDA;
    stage(b, cuda ? "generating CUDA code" : "generating C code");
    recipe_typed(&p->model->recipe, &p->recipe);
    p->recipe_typed = true;
    if (!p->precision.scale_loss) p->recipe.loss_scale = KILN_RECIPE_loss_scale_none; /* the step scales no loss */
    CodegenInput in = {
        .train = {p->train.graph, &p->train.plan},
        .eval = {p->eval.graph, &p->eval.plan},
        .predict = {p->predict.graph, &p->predict.plan},
        .decode = {p->decode.graph, &p->decode.plan},
        .decode_why = p->decode_why,
        .source_path = p->model->path,
        .recipe = &p->recipe,
        .bucket_bytes = b->opt->bucket_bytes,
        .model_hash = p->model_hash,
    };
    p->code_name = cuda ? "model.cu" : "model.c";
    const double t0 = pipeline_seconds();
    int rc = b->opt->infer ? (cuda ? codegen_cuda_infer(&in, &p->code, b->err) : codegen_c_infer(&in, &p->code, b->err))
                           : (cuda ? codegen_cuda(&in, &p->code, b->err) : codegen_c_train(&in, &p->code, b->err));
    if (b->opt->time_passes) {
        char note[64];
        snprintf(note, sizeof note, "%s, %zu bytes", p->code_name, p->code.len);
        pipeline_time_row(&p->timing, "codegen", "all", pipeline_seconds() - t0, 0, 0, note);
    }
    return rc;
}

/* Reads and lowers the model's file: the program's model and its training-mode graph. */
static int lower_model(Build *b)
{
    const KilnOptions *opt = b->opt;
    KilnProgram *p = b->p;
    const double t0 = pipeline_seconds();
    char *owned = NULL;
    const char *text = opt->text;
    size_t len = opt->len;
    if (!text) {
        StrBuf why;
        sb_init(&why);
        owned = util_read_file(opt->path, &len, &why);
        if (!owned) sb_printf(b->err, "kiln: error: %s", why.data);
        sb_free(&why);
        if (!owned) return -1;
        text = owned;
    }
    p->model = frontend_compile(&p->diag, opt->path, text, len, opt->mode);
    free(owned);
    diag_finish(&p->diag);
    if (!p->model) return -1;
    p->train.graph = p->model->graph; /* the program's from here on */
    p->model->graph = NULL;
    time_row(b, "lower", p->train.graph->mode == MODE_TRAIN ? "train" : "eval", t0, p->train.graph, "read and parsed the file");
    if (opt->keep_lowered) p->lowered = ir_graph_clone(p->train.graph);
    return 0;
}

KilnStatus kiln_compile(const KilnOptions *opt, KilnProgram **out, StrBuf *err)
{
    *out = NULL;
    KilnProgram *p = xcalloc(1, sizeof *p);
    p->unfused_arena = -1;
    p->attention_max_head = attention_max_head(opt);
    diag_init(&p->diag, opt->diagnostics);
    Build b = {.opt = opt, .p = p, .err = err, .cmd = opt->command ? opt->command : "build"};
    *out = p;
    if (lower_model(&b)) return KILN_ERR_MODEL;
    if (opt->plan_only && p->train.graph->mode != MODE_TRAIN) return KILN_OK; /* kiln check: nothing to plan */
    if (set_precision(&b)) return KILN_ERR_USAGE;
    if (opt->stop_after) { /* kiln ir, gradcheck: the training graph after a pass */
        PipelineOptions po = {.precision = &p->precision,
                              .unfused_attention = unfused_attention(opt),
                              .attention_max_head = attention_max_head(opt),
                              .plan = !strcmp(opt->stop_after, "fusion") || !strcmp(opt->stop_after, "memplan") ? &p->train.plan : NULL,
                              .times = opt->time_passes ? &p->timing : NULL,
                              .graph_name = "train"};
        return pipeline_run_opts(p->train.graph, opt->stop_after, &po, opt->stats ? &p->stats : NULL, err) ? KILN_ERR_MODEL : KILN_OK;
    }
    if (!opt->report) stage(&b, "running the passes (autodiff, simplify, remat, fusion, memplan)");
    if (apply_bounds(&b, p->train.graph)) return KILN_ERR_MODEL;
    p->model_hash = model_hash(p->train.graph, &p->precision);
    if (plan_eval(&b) || plan_training(&b, !opt->infer)) return KILN_ERR_MODEL;
    if (opt->infer && (plan_predict(&b) || plan_decode(&b))) return KILN_ERR_MODEL;
    /* the C target's training program samples through the decode step too; the CUDA
     * program's through its evaluation step (codegen.h says why) */
    if (!opt->infer && !opt->plan_only && opt->target == KILN_TARGET_C && plan_decode(&b)) return KILN_ERR_MODEL;
    if (opt->report) kiln_memory_report(p, opt->infer, &p->report);
    if (opt->plan_only) return KILN_OK;
    return generate_code(&b) ? KILN_ERR_MODEL : KILN_OK;
}

static void graph_free(KilnGraph *g)
{
    ir_graph_free(g->graph);
    graph_plan_free(&g->plan);
}

void kiln_program_free(KilnProgram *p)
{
    if (!p) return;
    graph_free(&p->train);
    graph_free(&p->eval);
    graph_free(&p->predict);
    graph_free(&p->decode);
    graph_free(&p->plain);
    ir_graph_free(p->lowered);
    frontend_model_free(p->model);
    free(p->decode_why);
    if (p->recipe_typed) recipe_typed_free(&p->recipe);
    sb_free(&p->code);
    sb_free(&p->report);
    sb_free(&p->notes);
    sb_free(&p->timing);
    sb_free(&p->stats);
    diag_free(&p->diag);
    free(p);
}
