/* test_recipe.c — nothing in the train section is accepted and ignored.
 *
 * One table row per recipe key and per argument of each loader, optimizer, schedule and
 * policy (every item of recipe_schema() must be covered by a row). A row compiles a tiny
 * model twice, with a base train section and a variant that differs in that key or
 * argument only, and shows the difference twice over:
 *   - in the flattened recipe the generated program receives (the kiln_model.recipe
 *     entries of `kiln emit`'s model.c), and
 *   - in what the built program does when run by its recipe alone, no flags: its start
 *     line, the losses or learning rates of its JSONL log, its evaluation or sample lines,
 *     the files it writes, how far it gets.
 * A value that could only be ignored is refused instead: the row's variant must then be
 * a located error of `kiln check`. A setting not implemented yet must at least warn.
 * Behavioural checks still to come are marked pending, with the reason. The checkpoint
 * policy is shown by the files a run leaves once the training program writes one
 * directory per checkpoint (with `latest`; rows marked RT_DIRS); with the single-file
 * layout, checkpoint steps is shown by how far a run gets whose checkpoint directory
 * cannot be made, and keep and epochs (which it ignores) are pending.
 *
 * Also: the golden warnings of tests/warn/ (precision needs none now; checkpoint(...)
 * needs none now), printed once by `kiln check` and by `kiln build`. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "support.h"

/* ---- the models: a classifier on npy/idx rows, a byte-level language model ---- */

enum { CLS, LM };

static const char *const model_text[2] = {
    "model tiny\n"
    "fc1 = Linear(4, 16)\n"
    "fc2 = Linear(16, 3)\n"
    "forward(x: u8[B, 4]) -> logits {\n"
    "    logits = fc2(relu(fc1(f32(x) / 255)))\n"
    "}\n"
    "loss(logits, y: u8[B]) = cross_entropy(logits, y)\n"
    "metric accuracy = mean(argmax(logits) == y)\n"
    "train {\n%s}\n",
    "model lm\n"
    "dim T <= 8\n"
    "wte = Embedding(256, 16)\n"
    "head = Linear(16, 256)\n"
    "forward(idx: i32[B, T]) -> logits {\n"
    "    logits = head(wte(idx))\n"
    "}\n"
    "loss(logits, targets: i32[B, T]) = cross_entropy(logits, targets)\n"
    "train {\n%s}\n",
};
static const char *const model_name[2] = {"tiny", "lm"};

/* The train section every row starts from; a row's lines replace the common line of the
 * same key, `key = -` removes it, other lines are added. */
static const char *const common[2] = {
    "data = npy(x = \"x.npy\", y = \"y.npy\")\nbatch = 8\nsteps = 4\nlog = \"log.jsonl\"\n",
    "data = text(\"corpus/*.txt\", input = idx, target = targets)\nbatch = 4\nsteps = 4\nlog = \"log.jsonl\"\n",
};

/* What differs between the base and the variant program. */
typedef enum {
    OBS_START,     /* the start line: samples, steps, batch, accumulation, optimizer */
    OBS_LOSSES,    /* the training losses of the JSONL log */
    OBS_LR,        /* the learning rates of the JSONL log */
    OBS_EVAL,      /* the `eval at step` lines */
    OBS_SAMPLE,    /* the generated sample */
    OBS_FILES,     /* the files the run writes */
    OBS_STEPS_RUN, /* the steps logged before the run stops (a checkpoint that cannot be written) */
    OBS_EXIT,      /* the exit status */
    OBS_REFUSED,   /* the variant is a located error of `kiln check` */
    OBS_WARNING,   /* the variant's `kiln build` warns that it has no effect yet */
    OBS_PLAN,      /* the memory plan `kiln check` prints (what `kiln build` will allocate) */
} Obs;

static const char *const obs_name[] = {"start line", "losses",         "learning rates", "eval lines", "sample",
                                       "files",      "steps run",      "exit status",    "refusal",    "warning",
                                       "memory plan"};

typedef struct {
    const char *covers;  /* recipe_schema() items shown, space-separated */
    int model;           /* CLS or LM */
    const char *base;    /* train lines over the common ones */
    const char *variant;
    const char *flat;    /* the kiln_model.recipe key whose value differs (NULL: refused) */
    Obs obs;
    const char *pending; /* the behavioural check is still to come: why */
    int runtime;         /* RT_ANY, or the checkpoint layout the behavioural check needs */
} Row;

enum { RT_ANY, RT_FILES, RT_DIRS }; /* checkpoints as DIR/model.safetensors, or DIR/step-N/ and DIR/latest */
static const char *const rt_name[] = {"", "single-file checkpoints", "one directory per checkpoint"};

#define SGD01 "optimizer = SGD(lr = 0.1)\n"
#define VAL05 "data = npy(x = \"x.npy\", y = \"y.npy\", val = 0.5)\n"
#define TOK "data = tokens(\"corpus.tok\", input = idx, target = targets)\n"
#define GEN20 "sample = generate(tokens = 20)\n"

static const Row rows[] = {
    /* data */
    {"data", CLS, "data = -\n", "", "data", OBS_EXIT, NULL, RT_ANY},
    {"data=npy.INPUT", CLS, "", "data = npy(x = \"x2.npy\", y = \"y.npy\")\n", "data.x", OBS_LOSSES, NULL, RT_ANY},
    {"data=npy.val", CLS, "", VAL05, "data.val", OBS_START, NULL, RT_ANY},
    {"data=idx.INPUT", CLS, "data = idx(x = \"x.idx\", y = \"y.idx\")\n", "data = idx(x = \"x2.idx\", y = \"y.idx\")\n", "data.x",
     OBS_LOSSES, NULL, RT_ANY},
    {"data=idx.val", CLS, "data = idx(x = \"x.idx\", y = \"y.idx\")\n", "data = idx(x = \"x.idx\", y = \"y.idx\", val = 0.5)\n",
     "data.val", OBS_START, NULL, RT_ANY},
    {"data=text.path", LM, "", "data = text(\"other/*.txt\", input = idx, target = targets)\n", "data.path", OBS_START, NULL, RT_ANY},
    {"data=text.val", LM, "", "data = text(\"corpus/*.txt\", input = idx, target = targets, val = 0.5)\n", "data.val", OBS_START,
     NULL, RT_ANY},
    {"data=text.exclude", LM, "data = text(\"corpus/*\", input = idx, target = targets)\n",
     "data = text(\"corpus/*\", exclude = \"*.md\", input = idx, target = targets)\n", "data.exclude", OBS_START, NULL, RT_ANY},
    {"data=text.input", LM, "", "data = text(\"corpus/*.txt\", input = targets, target = idx)\n", NULL, OBS_REFUSED, NULL, RT_ANY},
    {"data=text.target", LM, "", "data = text(\"corpus/*.txt\", input = idx, target = idx)\n", NULL, OBS_REFUSED, NULL, RT_ANY},
    {"data=tokens.path", LM, TOK, "data = tokens(\"other.tok\", input = idx, target = targets)\n", "data.path", OBS_START, NULL, RT_ANY},
    {"data=tokens.val", LM, TOK, "data = tokens(\"corpus.tok\", input = idx, target = targets, val = 0.5)\n", "data.val",
     OBS_START, NULL, RT_ANY},
    {"data=tokens.input", LM, TOK, "data = tokens(\"corpus.tok\", input = targets, target = idx)\n", NULL, OBS_REFUSED, NULL, RT_ANY},
    {"data=tokens.target", LM, TOK, "data = tokens(\"corpus.tok\", input = idx, target = idx)\n", NULL, OBS_REFUSED, NULL, RT_ANY},
    /* eval_data */
    {"eval_data eval_data=npy.INPUT", CLS, "", "eval_data = npy(x = \"ex.npy\", y = \"ey.npy\")\n", "eval_data.x", OBS_EVAL, NULL, RT_ANY},
    {"eval_data=npy.val", CLS, "eval_data = npy(x = \"ex.npy\", y = \"ey.npy\")\n",
     "eval_data = npy(x = \"ex.npy\", y = \"ey.npy\", val = 0.5)\n", NULL, OBS_REFUSED, NULL, RT_ANY},
    {"eval_data=idx.INPUT", CLS, "eval_data = idx(x = \"ex.idx\", y = \"ey.idx\")\n",
     "eval_data = idx(x = \"ex2.idx\", y = \"ey.idx\")\n", "eval_data.x", OBS_EVAL, NULL, RT_ANY},
    {"eval_data=idx.val", CLS, "eval_data = idx(x = \"ex.idx\", y = \"ey.idx\")\n",
     "eval_data = idx(x = \"ex.idx\", y = \"ey.idx\", val = 0.5)\n", NULL, OBS_REFUSED, NULL, RT_ANY},
    /* optimizer */
    {"optimizer", CLS, "", "optimizer = SGD()\n", "optimizer", OBS_LOSSES, NULL, RT_ANY},
    {"optimizer=SGD.lr", CLS, SGD01, "optimizer = SGD(lr = 0.5)\n", "optimizer.lr", OBS_LOSSES, NULL, RT_ANY},
    {"optimizer=SGD.momentum", CLS, SGD01, "optimizer = SGD(lr = 0.1, momentum = 0.9)\n", "optimizer.momentum", OBS_LOSSES, NULL, RT_ANY},
    {"optimizer=SGD.dampening", CLS, "optimizer = SGD(lr = 0.1, momentum = 0.9)\n",
     "optimizer = SGD(lr = 0.1, momentum = 0.9, dampening = 0.5)\n", "optimizer.dampening", OBS_LOSSES, NULL, RT_ANY},
    {"optimizer=SGD.nesterov", CLS, "optimizer = SGD(lr = 0.1, momentum = 0.9)\n",
     "optimizer = SGD(lr = 0.1, momentum = 0.9, nesterov = true)\n", "optimizer.nesterov", OBS_LOSSES, NULL, RT_ANY},
    {"optimizer=SGD.weight_decay", CLS, SGD01, "optimizer = SGD(lr = 0.1, weight_decay = 1)\n", "optimizer.weight_decay",
     OBS_LOSSES, NULL, RT_ANY},
    {"optimizer=SGD.decay", CLS, "optimizer = SGD(lr = 0.1, weight_decay = 1)\n",
     "optimizer = SGD(lr = 0.1, weight_decay = 1, decay = all)\n", "optimizer.decay", OBS_LOSSES, NULL, RT_ANY},
    {"optimizer=Adam.lr", CLS, "optimizer = Adam()\n", "optimizer = Adam(lr = 0.1)\n", "optimizer.lr", OBS_LOSSES, NULL, RT_ANY},
    {"optimizer=Adam.betas", CLS, "optimizer = Adam(lr = 0.1)\n", "optimizer = Adam(lr = 0.1, betas = [0.5, 0.9])\n",
     "optimizer.betas", OBS_LOSSES, NULL, RT_ANY},
    {"optimizer=Adam.eps", CLS, "optimizer = Adam(lr = 0.1)\n", "optimizer = Adam(lr = 0.1, eps = 1)\n", "optimizer.eps",
     OBS_LOSSES, NULL, RT_ANY},
    {"optimizer=Adam.weight_decay", CLS, "optimizer = Adam(lr = 0.1)\n", "optimizer = Adam(lr = 0.1, weight_decay = 1)\n",
     "optimizer.weight_decay", OBS_LOSSES, NULL, RT_ANY},
    {"optimizer=Adam.decay", CLS, "optimizer = Adam(lr = 0.1, weight_decay = 1)\n",
     "optimizer = Adam(lr = 0.1, weight_decay = 1, decay = all)\n", "optimizer.decay", OBS_LOSSES, NULL, RT_ANY},
    {"optimizer=AdamW.lr", CLS, "", "optimizer = AdamW(lr = 0.1)\n", "optimizer.lr", OBS_LOSSES, NULL, RT_ANY},
    {"optimizer=AdamW.betas", CLS, "optimizer = AdamW(lr = 0.1)\n", "optimizer = AdamW(lr = 0.1, betas = [0.5, 0.9])\n",
     "optimizer.betas", OBS_LOSSES, NULL, RT_ANY},
    {"optimizer=AdamW.eps", CLS, "optimizer = AdamW(lr = 0.1)\n", "optimizer = AdamW(lr = 0.1, eps = 1)\n", "optimizer.eps",
     OBS_LOSSES, NULL, RT_ANY},
    {"optimizer=AdamW.weight_decay", CLS, "optimizer = AdamW(lr = 0.1)\n", "optimizer = AdamW(lr = 0.1, weight_decay = 0.5)\n",
     "optimizer.weight_decay", OBS_LOSSES, NULL, RT_ANY},
    {"optimizer=AdamW.decay", CLS, "optimizer = AdamW(lr = 0.1, weight_decay = 0.5)\n",
     "optimizer = AdamW(lr = 0.1, weight_decay = 0.5, decay = all)\n", "optimizer.decay", OBS_LOSSES, NULL, RT_ANY},
    {"optimizer=Adam.amsgrad", CLS, "optimizer = Adam(lr = 0.1)\n", "optimizer = Adam(lr = 0.1, amsgrad = true)\n", "optimizer.amsgrad", OBS_LOSSES, NULL, RT_ANY},
    {"optimizer=AdamW.amsgrad", CLS, "optimizer = AdamW(lr = 0.1, betas = [0.9, 0.5])\n", "optimizer = AdamW(lr = 0.1, betas = [0.9, 0.5], amsgrad = true)\n", "optimizer.amsgrad", OBS_LOSSES, NULL, RT_ANY},
    {"optimizer=RMSprop.lr", CLS, "optimizer = RMSprop()\n", "optimizer = RMSprop(lr = 0.1)\n", "optimizer.lr", OBS_LOSSES, NULL, RT_ANY},
    {"optimizer=RMSprop.alpha", CLS, "optimizer = RMSprop(lr = 0.01)\n", "optimizer = RMSprop(lr = 0.01, alpha = 0.5)\n", "optimizer.alpha", OBS_LOSSES, NULL, RT_ANY},
    {"optimizer=RMSprop.eps", CLS, "optimizer = RMSprop(lr = 0.01)\n", "optimizer = RMSprop(lr = 0.01, eps = 1)\n", "optimizer.eps", OBS_LOSSES, NULL, RT_ANY},
    {"optimizer=RMSprop.weight_decay", CLS, "optimizer = RMSprop(lr = 0.01)\n", "optimizer = RMSprop(lr = 0.01, weight_decay = 1)\n", "optimizer.weight_decay", OBS_LOSSES, NULL, RT_ANY},
    {"optimizer=RMSprop.momentum", CLS, "optimizer = RMSprop(lr = 0.01)\n", "optimizer = RMSprop(lr = 0.01, momentum = 0.9)\n", "optimizer.momentum", OBS_LOSSES, NULL, RT_ANY},
    {"optimizer=RMSprop.centered", CLS, "optimizer = RMSprop(lr = 0.01)\n", "optimizer = RMSprop(lr = 0.01, centered = true)\n", "optimizer.centered", OBS_LOSSES, NULL, RT_ANY},
    {"optimizer=RMSprop.decay", CLS, "optimizer = RMSprop(lr = 0.01, weight_decay = 1)\n", "optimizer = RMSprop(lr = 0.01, weight_decay = 1, decay = all)\n", "optimizer.decay", OBS_LOSSES, NULL, RT_ANY},
    {"optimizer=Adagrad.lr", CLS, "optimizer = Adagrad()\n", "optimizer = Adagrad(lr = 0.1)\n", "optimizer.lr", OBS_LOSSES, NULL, RT_ANY},
    {"optimizer=Adagrad.lr_decay", CLS, "optimizer = Adagrad(lr = 0.1)\n", "optimizer = Adagrad(lr = 0.1, lr_decay = 1)\n", "optimizer.lr_decay", OBS_LOSSES, NULL, RT_ANY},
    {"optimizer=Adagrad.weight_decay", CLS, "optimizer = Adagrad(lr = 0.1)\n", "optimizer = Adagrad(lr = 0.1, weight_decay = 1)\n", "optimizer.weight_decay", OBS_LOSSES, NULL, RT_ANY},
    {"optimizer=Adagrad.initial_accumulator_value", CLS, "optimizer = Adagrad(lr = 0.1)\n", "optimizer = Adagrad(lr = 0.1, initial_accumulator_value = 1)\n", "optimizer.initial_accumulator_value", OBS_LOSSES, NULL, RT_ANY},
    {"optimizer=Adagrad.eps", CLS, "optimizer = Adagrad(lr = 0.1)\n", "optimizer = Adagrad(lr = 0.1, eps = 1)\n", "optimizer.eps", OBS_LOSSES, NULL, RT_ANY},
    {"optimizer=Adagrad.decay", CLS, "optimizer = Adagrad(lr = 0.1, weight_decay = 1)\n", "optimizer = Adagrad(lr = 0.1, weight_decay = 1, decay = all)\n", "optimizer.decay", OBS_LOSSES, NULL, RT_ANY},
    {"optimizer=Lion.lr", CLS, "optimizer = Lion()\n", "optimizer = Lion(lr = 0.01)\n", "optimizer.lr", OBS_LOSSES, NULL, RT_ANY},
    {"optimizer=Lion.betas", CLS, "optimizer = Lion(lr = 0.01)\n", "optimizer = Lion(lr = 0.01, betas = [0.5, 0.9])\n", "optimizer.betas", OBS_LOSSES, NULL, RT_ANY},
    {"optimizer=Lion.weight_decay", CLS, "optimizer = Lion(lr = 0.01)\n", "optimizer = Lion(lr = 0.01, weight_decay = 1)\n", "optimizer.weight_decay", OBS_LOSSES, NULL, RT_ANY},
    {"optimizer=Lion.decay", CLS, "optimizer = Lion(lr = 0.01, weight_decay = 1)\n", "optimizer = Lion(lr = 0.01, weight_decay = 1, decay = all)\n", "optimizer.decay", OBS_LOSSES, NULL, RT_ANY},
    /* schedule */
    {"schedule", CLS, "", "schedule = cosine()\n", "schedule", OBS_LR, NULL, RT_ANY},
    {"schedule=constant.warmup", CLS, "schedule = constant()\n", "schedule = constant(warmup = 2)\n", "schedule.warmup", OBS_LR, NULL, RT_ANY},
    {"schedule=step.step_size", CLS, "schedule = step(step_size = 1)\n", "schedule = step(step_size = 2)\n", "schedule.step_size",
     OBS_LR, NULL, RT_ANY},
    {"schedule=step.gamma", CLS, "schedule = step(step_size = 1)\n", "schedule = step(step_size = 1, gamma = 0.5)\n",
     "schedule.gamma", OBS_LR, NULL, RT_ANY},
    {"schedule=step.warmup", CLS, "schedule = step(step_size = 1)\n", "schedule = step(step_size = 1, warmup = 2)\n",
     "schedule.warmup", OBS_LR, NULL, RT_ANY},
    {"schedule=linear.warmup", CLS, "schedule = linear()\n", "schedule = linear(warmup = 2)\n", "schedule.warmup", OBS_LR, NULL, RT_ANY},
    {"schedule=linear.min_lr", CLS, "schedule = linear()\n", "schedule = linear(min_lr = 0.0005)\n", "schedule.min_lr", OBS_LR, NULL, RT_ANY},
    {"schedule=cosine.warmup", CLS, "schedule = cosine()\n", "schedule = cosine(warmup = 2)\n", "schedule.warmup", OBS_LR, NULL, RT_ANY},
    {"schedule=cosine.min_lr", CLS, "schedule = cosine()\n", "schedule = cosine(min_lr = 0.0005)\n", "schedule.min_lr", OBS_LR, NULL, RT_ANY},
    {"schedule=onecycle.max_lr", CLS, "schedule = onecycle()\n", "schedule = onecycle(max_lr = 0.01)\n", "schedule.max_lr", OBS_LR, NULL, RT_ANY},
    {"schedule=onecycle.pct_start", CLS, "schedule = onecycle()\n", "schedule = onecycle(pct_start = 0.5)\n", "schedule.pct_start", OBS_LR, NULL, RT_ANY},
    {"schedule=onecycle.anneal_strategy", CLS, "schedule = onecycle()\n", "schedule = onecycle(anneal_strategy = linear)\n", "schedule.anneal_strategy", OBS_LR, NULL, RT_ANY},
    {"schedule=onecycle.div_factor", CLS, "schedule = onecycle()\n", "schedule = onecycle(div_factor = 10)\n", "schedule.div_factor", OBS_LR, NULL, RT_ANY},
    {"schedule=onecycle.final_div_factor", CLS, "schedule = onecycle()\n", "schedule = onecycle(final_div_factor = 10)\n", "schedule.final_div_factor", OBS_LR, NULL, RT_ANY},
    {"schedule=onecycle.three_phase", CLS, "schedule = onecycle()\n", "schedule = onecycle(three_phase = true)\n", "schedule.three_phase", OBS_LR, NULL, RT_ANY},
    {"schedule=exponential.gamma", CLS, "schedule = exponential(gamma = 0.9)\n", "schedule = exponential(gamma = 0.5)\n", "schedule.gamma", OBS_LR, NULL, RT_ANY},
    {"schedule=exponential.warmup", CLS, "schedule = exponential(gamma = 0.9)\n", "schedule = exponential(gamma = 0.9, warmup = 2)\n", "schedule.warmup", OBS_LR, NULL, RT_ANY},
    {"schedule=polynomial.power", CLS, "schedule = polynomial()\n", "schedule = polynomial(power = 2)\n", "schedule.power", OBS_LR, NULL, RT_ANY},
    {"schedule=polynomial.total_iters", CLS, "schedule = polynomial()\n", "schedule = polynomial(total_iters = 2)\n", "schedule.total_iters", OBS_LR, NULL, RT_ANY},
    {"schedule=polynomial.warmup", CLS, "schedule = polynomial()\n", "schedule = polynomial(warmup = 2)\n", "schedule.warmup", OBS_LR, NULL, RT_ANY},
    {"schedule=cosine_restarts.T_0", CLS, "schedule = cosine_restarts(T_0 = 2)\n", "schedule = cosine_restarts(T_0 = 3)\n", "schedule.T_0", OBS_LR, NULL, RT_ANY},
    {"schedule=cosine_restarts.T_mult", CLS, "schedule = cosine_restarts(T_0 = 1)\n", "schedule = cosine_restarts(T_0 = 1, T_mult = 2)\n", "schedule.T_mult", OBS_LR, NULL, RT_ANY},
    {"schedule=cosine_restarts.eta_min", CLS, "schedule = cosine_restarts(T_0 = 2)\n", "schedule = cosine_restarts(T_0 = 2, eta_min = 0.0005)\n", "schedule.eta_min", OBS_LR, NULL, RT_ANY},
    {"schedule=cosine_restarts.warmup", CLS, "schedule = cosine_restarts(T_0 = 2)\n", "schedule = cosine_restarts(T_0 = 2, warmup = 2)\n", "schedule.warmup", OBS_LR, NULL, RT_ANY},
    /* parameter groups */
    {"groups", CLS, "", "groups = [group(\"fc2.*\", lr = 0.1)]\n", "groups", OBS_LOSSES, NULL, RT_ANY},
    {"groups=group.pattern", CLS, "groups = [group(\"fc2.*\", lr = 0.1)]\n", "groups = [group(\"fc1.*\", lr = 0.1)]\n", "groups.0.pattern", OBS_LOSSES, NULL, RT_ANY},
    {"groups=group.lr", CLS, "groups = [group(\"fc2.*\", weight_decay = 0.5)]\n", "groups = [group(\"fc2.*\", weight_decay = 0.5, lr = 0.1)]\n",
     "groups.0.lr", OBS_LOSSES, NULL, RT_ANY},
    {"groups=group.weight_decay", CLS, "groups = [group(\"fc2.*\", lr = 0.1)]\n", "groups = [group(\"fc2.*\", lr = 0.1, weight_decay = 1)]\n", "groups.0.weight_decay",
     OBS_LOSSES, NULL, RT_ANY},
    /* scalars */
    {"batch", CLS, "", "batch = 16\n", "batch", OBS_START, NULL, RT_ANY},
    {"epochs", CLS, "steps = -\n", "steps = -\nepochs = 2\n", "epochs", OBS_START, NULL, RT_ANY},
    {"steps", CLS, "", "steps = 6\n", "steps", OBS_START, NULL, RT_ANY},
    {"clip", CLS, "optimizer = SGD(lr = 0.5)\n", "optimizer = SGD(lr = 0.5)\nclip = 0.01\n", "clip", OBS_LOSSES, NULL, RT_ANY},
    {"accumulate", CLS, "", "accumulate = 2\n", "accumulate", OBS_START, NULL, RT_ANY},
    {"precision", CLS, "", "precision = bf16\n", "precision", OBS_LOSSES, NULL, RT_ANY},
    {"precision", CLS, "", "precision = fp16\n", "precision", OBS_LOSSES, NULL, RT_ANY},
    {"precision", CLS, "", "precision = fp8\n", NULL, OBS_REFUSED, NULL, RT_ANY},
    {"weight_rounding", CLS, "precision = bf16\n", "precision = bf16\nweight_rounding = stochastic\n", "weight_rounding", OBS_LOSSES, NULL, RT_ANY},
    {"weight_rounding", CLS, "", "weight_rounding = stochastic\n", NULL, OBS_REFUSED, NULL, RT_ANY},
    /* fp16's loss scaling: a scale of 1e30 overflows every step, which is then skipped (no update) */
    {"loss_scale", CLS, "precision = fp16\n", "precision = fp16\nloss_scale = 1e30\n", "loss_scale", OBS_LOSSES, NULL, RT_ANY},
    {"loss_scale", CLS, "", "loss_scale = dynamic\n", NULL, OBS_REFUSED, NULL, RT_ANY},
    {"loss_scale_init", CLS, "precision = fp16\n", "precision = fp16\nloss_scale_init = 1e30\n", "loss_scale_init", OBS_LOSSES, NULL, RT_ANY},
    {"loss_scale_growth_interval", CLS, "precision = fp16\n", "precision = fp16\nloss_scale_growth_interval = 3\n",
     "loss_scale_growth_interval", OBS_START, NULL, RT_ANY},
    /* the budget is planned at compile time: the tiny model has no block to checkpoint, so
     * the plan shows the budget it was checked against (test_remat: gpt's blocks chosen) */
    {"memory_budget", CLS, "", "memory_budget = \"64MiB\"\n", "memory_budget", OBS_PLAN, NULL, RT_ANY},
    {"memory_budget", CLS, "", "memory_budget = \"lots\"\n", NULL, OBS_REFUSED, NULL, RT_ANY},
    {"seed", CLS, "", "seed = 1\n", "seed", OBS_LOSSES, NULL, RT_ANY},
    {"log", CLS, "log = -\n", "log = \"other.jsonl\"\n", "log", OBS_FILES, NULL, RT_ANY},
    /* checkpoint: 4 steps of an 8-step epoch */
    {"checkpoint checkpoint=every.dir", CLS, "", "checkpoint = every(dir = \"ck2\")\n", "checkpoint.dir", OBS_FILES, NULL, RT_ANY},
    {"checkpoint=every.steps", CLS, "", "checkpoint = every(steps = 1)\n", "checkpoint.steps", OBS_FILES, NULL, RT_DIRS},
    /* single files: a directory under a plain file cannot be made, so the run stops at its first save */
    {"checkpoint=every.steps", CLS, "checkpoint = every(dir = \"blocked/ck\")\n", "checkpoint = every(steps = 1, dir = \"blocked/ck\")\n",
     "checkpoint.steps", OBS_STEPS_RUN, NULL, RT_FILES},
    {"checkpoint=every.epochs", CLS, "steps = -\nepochs = 2\n", "steps = -\nepochs = 2\ncheckpoint = every(epochs = 2)\n",
     "checkpoint.epochs", OBS_FILES, NULL, RT_DIRS},
    {"checkpoint=every.keep", CLS, "checkpoint = every(steps = 1)\n", "checkpoint = every(steps = 1, keep = 3)\n",
     "checkpoint.keep", OBS_FILES, NULL, RT_DIRS},
    /* eval: a val split of half the rows, 4 steps an epoch */
    {"eval eval=every.steps", CLS, VAL05, VAL05 "eval = every(steps = 1)\n", "eval.steps", OBS_EVAL, NULL, RT_ANY},
    {"eval=every.batches", CLS, VAL05, VAL05 "eval = every(batches = 1)\n", "eval.batches", OBS_EVAL, NULL, RT_ANY},
    /* (eval epochs came with the checkpoint directories: the single-file runtime ignores it) */
    {"eval=every.epochs", CLS, VAL05 "steps = 8\n", VAL05 "steps = 8\neval = every(epochs = 2)\n", "eval.epochs", OBS_EVAL, NULL,
     RT_DIRS},
    /* sample (language models) */
    {"sample sample=generate.tokens", LM, "", "sample = generate(tokens = 20)\n", "sample.tokens", OBS_SAMPLE, NULL, RT_ANY},
    {"sample=generate.temperature", LM, GEN20, "sample = generate(tokens = 20, temperature = 2)\n", "sample.temperature",
     OBS_SAMPLE, NULL, RT_ANY},
    {"sample=generate.top_k", LM, GEN20, "sample = generate(tokens = 20, top_k = 1)\n", "sample.top_k", OBS_SAMPLE, NULL, RT_ANY},
    {"sample=generate.prompt", LM, GEN20, "sample = generate(tokens = 20, prompt = \"the \")\n", "sample.prompt", OBS_SAMPLE,
     NULL, RT_ANY},
};
#define NROWS ((int)(sizeof rows / sizeof rows[0]))

/* ---- the test's directory: data files, model files, programs, runs ---- */

static char root[64];

static void put_file(const char *rel, const void *data, size_t n)
{
    char path[256];
    snprintf(path, sizeof path, "%s/data/%s", root, rel);
    FILE *f = fopen(path, "wb");
    cr_assert(f, "cannot write %s", path);
    cr_assert_eq(fwrite(data, 1, n, f), n);
    fclose(f);
}

/* A u8 .npy file of shape [rows] or [rows, cols]. */
static void put_npy(const char *rel, const uint8_t *v, int rows_, int cols)
{
    char dict[128];
    if (cols) snprintf(dict, sizeof dict, "{'descr': '|u1', 'fortran_order': False, 'shape': (%d, %d), }", rows_, cols);
    else snprintf(dict, sizeof dict, "{'descr': '|u1', 'fortran_order': False, 'shape': (%d,), }", rows_);
    size_t hl = strlen(dict) + 1, total = 10 + hl;
    size_t pad = (64 - total % 64) % 64;
    size_t n = total + pad + (size_t)rows_ * (size_t)(cols ? cols : 1);
    uint8_t *b = malloc(n);
    memcpy(b, "\x93NUMPY\x01\x00", 8);
    b[8] = (uint8_t)((hl + pad) & 0xff), b[9] = (uint8_t)((hl + pad) >> 8);
    memcpy(b + 10, dict, hl - 1);
    memset(b + 10 + hl - 1, ' ', pad);
    b[total + pad - 1] = '\n';
    memcpy(b + total + pad, v, (size_t)rows_ * (size_t)(cols ? cols : 1));
    put_file(rel, b, n);
    free(b);
}

/* A u8 IDX file of shape [rows] or [rows, cols]. */
static void put_idx(const char *rel, const uint8_t *v, int rows_, int cols)
{
    int rank = cols ? 2 : 1;
    size_t n = 4 + 4 * (size_t)rank + (size_t)rows_ * (size_t)(cols ? cols : 1);
    uint8_t *b = calloc(n, 1);
    b[2] = 0x08, b[3] = (uint8_t)rank;
    int dims[2] = {rows_, cols};
    for (int i = 0; i < rank; i++)
        for (int k = 0; k < 4; k++) b[4 + 4 * i + k] = (uint8_t)(dims[i] >> (24 - 8 * k));
    memcpy(b + 4 + 4 * rank, v, (size_t)rows_ * (size_t)(cols ? cols : 1));
    put_file(rel, b, n);
    free(b);
}

/* Rows of 4 pixels and their class (the brightest of the first three), from a seed. */
static void make_rows(uint32_t seed, int n, uint8_t *x, uint8_t *y)
{
    for (int i = 0; i < n; i++) {
        int best = 0;
        for (int k = 0; k < 4; k++) {
            seed = seed * 1664525u + 1013904223u;
            x[4 * i + k] = (uint8_t)(seed >> 24);
            if (k < 3 && x[4 * i + k] > x[4 * i + best]) best = k;
        }
        y[i] = (uint8_t)best;
    }
}

static void sh(const char *fmt, const char *arg)
{
    char cmd[2100], sub[2048];
    snprintf(sub, sizeof sub, fmt, arg);
    snprintf(cmd, sizeof cmd, "( %s )", sub); /* support_run's 2>&1 for all of it */
    StrBuf out;
    sb_init(&out);
    int rc = support_run(cmd, &out);
    cr_assert_eq(rc, 0, "`%s` failed:\n%s", cmd, out.data ? out.data : "");
    sb_free(&out);
}

static void make_data(void)
{
    snprintf(root, sizeof root, "/tmp/kiln-recipe-XXXXXX");
    cr_assert(mkdtemp(root));
    sh("cd '%s' && mkdir data models runs data/corpus data/other && : > data/blocked", root);
    uint8_t x[64 * 4], y[64], x2[64 * 4], y2[64];
    make_rows(1, 64, x, y);
    make_rows(2, 64, x2, y2);
    put_npy("x.npy", x, 64, 4), put_npy("y.npy", y, 64, 0), put_npy("x2.npy", x2, 64, 4);
    put_idx("x.idx", x, 64, 4), put_idx("y.idx", y, 64, 0), put_idx("x2.idx", x2, 64, 4);
    make_rows(3, 32, x, y);
    make_rows(4, 32, x2, y2);
    put_npy("ex.npy", x, 32, 4), put_npy("ey.npy", y, 32, 0);
    put_idx("ex.idx", x, 32, 4), put_idx("ey.idx", y, 32, 0), put_idx("ex2.idx", x2, 32, 4);
    StrBuf t;
    sb_init(&t);
    for (int i = 0; i < 100; i++) sb_puts(&t, "the quick brown fox jumps over the lazy dog\n");
    put_file("corpus/a.txt", t.data, t.len);
    t.len = 0;
    for (int i = 0; i < 50; i++) sb_puts(&t, "# notes, not training text\n");
    put_file("corpus/b.md", t.data, t.len);
    t.len = 0;
    for (int i = 0; i < 60; i++) sb_puts(&t, "a different text, and a shorter one\n");
    put_file("other/c.txt", t.data, t.len);
    sb_free(&t);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "cd '%s/data' && '%s' tokens 'corpus/*.txt' -o corpus.tok && '%s' tokens 'other/*.txt' -o other.tok",
             root, KILN_BINARY, KILN_BINARY);
    sh("%s", cmd);
}

/* ---- compiling a train section: check, emit (the recipe table), build; cached ---- */

typedef struct {
    char *source;
    int check_rc, build_rc;
    char *check_out, *build_out;
    char *flat;  /* "key=value\n" lines of the kiln_model.recipe table */
    char prog[256];
} Compiled;

static Compiled cache[2 * NROWS + 8];
static int ncache;

/* The train body of a row's side: the common lines with the row's lines applied. */
static void compose(int model, const char *lines, StrBuf *body)
{
    const char *c = common[model];
    for (int pass = 0; pass < 2; pass++) {
        const char *src = pass ? lines : c;
        for (const char *p = src; *p;) {
            size_t len = strcspn(p, "\n"), klen = strcspn(p, " =");
            const char *over = NULL;
            const char *other = pass ? c : lines;
            for (const char *q = other; *q;) {
                size_t ql = strcspn(q, "\n");
                if (strcspn(q, " =") == klen && !strncmp(q, p, klen)) over = q;
                q += ql + (q[ql] == '\n');
            }
            if (pass == 0 && over) { /* replaced or removed by the row */
                size_t ol = strcspn(over, "\n");
                if (!(ol >= 3 && !strncmp(over + ol - 3, "= -", 3))) sb_printf(body, "    %.*s\n", (int)ol, over);
            } else if (pass == 1 && !over && !(len >= 3 && !strncmp(p + len - 3, "= -", 3))) {
                sb_printf(body, "    %.*s\n", (int)len, p);
            } else if (pass == 0) {
                sb_printf(body, "    %.*s\n", (int)len, p);
            }
            p += len + (p[len] == '\n');
        }
    }
}

/* The typed recipe of a generated model.c (kiln_recipe.h's struct, as codegen writes it)
 * as "key=value\n" lines named as the recipe writes them: "optimizer.lr" for the field
 * optimizer_lr, "data.x" for input x's file, "groups.0.lr" for the first group's lr. */
static void struct_lines(const char *model_c, StrBuf *out)
{
    static const char *const calls[] = {"eval_data", "data", "optimizer", "schedule", "checkpoint", "eval", "sample"};
    const char *p = strstr(model_c, "static const kiln_recipe recipe = {");
    const char *end = p ? strstr(p, "\n};") : NULL;
    for (p = p ? strchr(p, '\n') : NULL; p && p < end; p = strchr(p + 1, '\n')) {
        const char *f = strstr(p, "    ."), *eq = f ? strstr(f, " = ") : NULL;
        const char *le = strchr(p + 1, '\n');
        if (!f || !eq || f > le || eq > le) continue;
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)(eq - f - 5), f + 5);
        for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++) {
            size_t cl = strlen(calls[i]);
            if (!strncmp(name, calls[i], cl) && name[cl] == '_' && strcmp(name + cl, "_files")) {
                name[cl] = '.';
                break;
            }
        }
        size_t vl = (size_t)(le - eq - 3);
        if (vl && eq[3 + vl - 1] == ',') vl--;
        sb_printf(out, "%s=%.*s\n", name, (int)vl, eq + 3);
    }
}

/* The rows of array `name` ("static const TYPE name[] = {" ... "};") as lines: key
 * "groups" for the groups, else a data key whose files the rows are. */
static void array_rows(const char *model_c, const char *name, const char *key, StrBuf *out)
{
    char head[128];
    snprintf(head, sizeof head, " %s[] = {\n", name);
    const char *p = strstr(model_c, head);
    const char *end = p ? strstr(p, "\n};") : NULL;
    int k = 0;
    for (p = p ? strchr(p, '\n') : NULL; p && p < end; p = strchr(p + 1, '\n'), k++) {
        const char *b = strstr(p, "    {"), *e = b ? strstr(b, "},") : NULL;
        if (!b || !e || b > end) break;
        char row[1024];
        snprintf(row, sizeof row, "%.*s", (int)(e - b - 5), b + 5);
        if (strcmp(key, "groups")) { /* {"x", "x.npy"} */
            char input[128] = "", path[512] = "";
            if (sscanf(row, "\"%127[^\"]\", \"%511[^\"]\"", input, path) == 2) sb_printf(out, "%s.%s=%s\n", key, input, path);
        } else { /* {"pattern", has_lr, has_wd, lr, wd, params, n} */
            char pattern[256] = "", has_lr[8] = "", has_wd[8] = "", lr[64] = "", wd[64] = "";
            if (sscanf(row, "\"%255[^\"]\", %7[^,], %7[^,], %63[^,], %63[^,],", pattern, has_lr, has_wd, lr, wd) == 5) {
                sb_printf(out, "groups.%d.pattern=%s\n", k, pattern);
                if (!strcmp(has_lr, "true")) sb_printf(out, "groups.%d.lr=%s\n", k, lr);
                if (!strcmp(has_wd, "true")) sb_printf(out, "groups.%d.weight_decay=%s\n", k, wd);
            }
        }
    }
}

static char *recipe_table(const char *model_c)
{
    StrBuf out;
    sb_init(&out);
    struct_lines(model_c, &out);
    array_rows(model_c, "recipe_data_files", "data", &out);
    array_rows(model_c, "recipe_eval_data_files", "eval_data", &out);
    array_rows(model_c, "recipe_groups", "groups", &out);
    return out.data ? sb_take(&out) : calloc(1, 1);
}

static const Compiled *compile(int model, const char *lines)
{
    StrBuf body, src;
    sb_init(&body);
    sb_init(&src);
    compose(model, lines, &body);
    sb_printf(&src, model_text[model], body.data ? body.data : "");
    sb_free(&body);
    for (int i = 0; i < ncache; i++)
        if (!strcmp(cache[i].source, src.data)) {
            sb_free(&src);
            return &cache[i];
        }
    cr_assert_lt(ncache, (int)(sizeof cache / sizeof cache[0]));
    Compiled *c = &cache[ncache];
    memset(c, 0, sizeof *c);
    c->source = sb_take(&src);
    char file[256], args[1024];
    snprintf(file, sizeof file, "%s/models/m%d.kiln", root, ncache);
    FILE *f = fopen(file, "w");
    cr_assert(f);
    fputs(c->source, f);
    fclose(f);
    StrBuf out;
    sb_init(&out);
    snprintf(args, sizeof args, "check %s", file);
    c->check_rc = support_run_kiln(args, &out);
    c->check_out = out.data ? sb_take(&out) : calloc(1, 1);
    if (c->check_rc == 0) {
        sb_init(&out);
        snprintf(args, sizeof args, "emit %s -o %s/models/m%d", file, root, ncache);
        cr_assert_eq(support_run_kiln(args, &out), 0, "kiln %s:\n%s", args, out.data);
        sb_free(&out);
        snprintf(args, sizeof args, "%s/models/m%d/model.c", root, ncache);
        size_t n;
        StrBuf err;
        sb_init(&err);
        char *text = util_read_file(args, &n, &err);
        cr_assert(text, "%s", err.data);
        sb_free(&err);
        c->flat = recipe_table(text);
        free(text);
        snprintf(c->prog, sizeof c->prog, "%s/models/p%d", root, ncache);
        sb_init(&out);
        /* -O0: the programs run a few steps of a tiny model; compiling is what takes time. */
        snprintf(args, sizeof args, "build %s -o %s --cflags -O0", file, c->prog);
        c->build_rc = support_run_kiln(args, &out);
        c->build_out = out.data ? sb_take(&out) : calloc(1, 1);
        cr_assert_eq(c->build_rc, 0, "kiln %s:\n%s", args, c->build_out);
    }
    ncache++;
    return c;
}

/* The value of key in a recipe table, as a new string; NULL when absent. */
static char *flat_value(const char *flat, const char *key)
{
    size_t kl = strlen(key);
    for (const char *p = flat; p && *p; p = strchr(p, '\n') + 1) {
        size_t len = strcspn(p, "\n");
        if (len > kl && !strncmp(p, key, kl) && p[kl] == '=') {
            char *v = malloc(len - kl);
            memcpy(v, p + kl + 1, len - kl - 1);
            v[len - kl - 1] = 0;
            return v;
        }
        if (!p[len]) break;
    }
    return NULL;
}

/* ---- running a program by its recipe, and what it did ---- */

typedef struct {
    int rc;
    char *out; /* stdout and stderr */
    char *log; /* run/log.jsonl */
    char *files;
} Run;

static int nruns;

static Run run_program(const Compiled *c)
{
    Run r;
    memset(&r, 0, sizeof r);
    char dir[256], cmd[1024];
    snprintf(dir, sizeof dir, "%s/runs/r%d", root, nruns++);
    snprintf(cmd, sizeof cmd, "mkdir '%s' && cd '%s' && ln -s ../../data/* . && OMP_NUM_THREADS=1 '%s'", dir, dir, c->prog);
    StrBuf out;
    sb_init(&out);
    r.rc = support_run(cmd, &out);
    r.out = out.data ? sb_take(&out) : calloc(1, 1);
    snprintf(cmd, sizeof cmd, "%s/log.jsonl", dir);
    size_t n;
    StrBuf err;
    sb_init(&err);
    r.log = util_read_file(cmd, &n, &err);
    if (!r.log) r.log = calloc(1, 1);
    sb_free(&err);
    sb_init(&out);
    snprintf(cmd, sizeof cmd, "cd '%s' && find . -type f | sort", dir);
    support_run(cmd, &out);
    r.files = out.data ? sb_take(&out) : calloc(1, 1);
    return r;
}

static void run_free(Run *r)
{
    free(r->out);
    free(r->log);
    free(r->files);
}

/* The lines of text that start with prefix. */
static void lines_starting(const char *text, const char *prefix, StrBuf *o)
{
    size_t pl = strlen(prefix);
    for (const char *p = text; *p;) {
        size_t len = strcspn(p, "\n");
        if (len >= pl && !strncmp(p, prefix, pl)) sb_printf(o, "%.*s\n", (int)len, p);
        p += len + (p[len] == '\n');
    }
}

/* The values of "field" in the training lines of a JSONL log (not the eval lines). */
static void log_field(const char *log, const char *field, StrBuf *o, int *nlines)
{
    char key[64];
    snprintf(key, sizeof key, "\"%s\": ", field);
    for (const char *p = log; *p;) {
        size_t len = strcspn(p, "\n");
        const char *hit = strstr(p, key);
        if (hit && hit < p + len && !strstr(p, "eval_loss")) {
            sb_printf(o, "%.*s ", (int)strcspn(hit + strlen(key), ",}"), hit + strlen(key));
            if (nlines) (*nlines)++;
        }
        p += len + (p[len] == '\n');
    }
}

static char *observe(const Row *row, const Run *r)
{
    StrBuf o;
    sb_init(&o);
    int n = 0;
    char prefix[16];
    switch (row->obs) {
    case OBS_START:
        snprintf(prefix, sizeof prefix, "%s: ", model_name[row->model]);
        lines_starting(r->out, prefix, &o);
        break;
    case OBS_LOSSES: log_field(r->log, "loss", &o, NULL); break;
    case OBS_LR: log_field(r->log, "lr", &o, NULL); break;
    case OBS_EVAL: lines_starting(r->out, "eval at step", &o); break;
    case OBS_SAMPLE: sb_puts(&o, strstr(r->out, "sample at step") ? strstr(r->out, "sample at step") : ""); break;
    case OBS_FILES: sb_puts(&o, r->files); break;
    case OBS_STEPS_RUN:
        log_field(r->log, "loss", &o, &n);
        o.len = 0;
        sb_printf(&o, "%d steps", n);
        break;
    case OBS_EXIT: sb_printf(&o, "exit %d", r->rc); break;
    default: break;
    }
    return o.data ? sb_take(&o) : calloc(1, 1);
}

/* The checkpoint layout of the training program, from where a default run saves. */
static int runtime;

static int detect_runtime(void)
{
    Run r = run_program(compile(CLS, ""));
    cr_assert_eq(r.rc, 0, "the common program failed:\n%s", r.out);
    int rt = strstr(r.files, "./checkpoints/latest") ? RT_DIRS : RT_FILES;
    run_free(&r);
    return rt;
}

static bool expects_success(Obs obs) { return obs != OBS_EXIT && obs != OBS_STEPS_RUN; }

static void check_row(const Row *row)
{
    const Compiled *b = compile(row->model, row->base), *v = compile(row->model, row->variant);
    cr_assert_eq(b->check_rc, 0, "[%s] the base does not compile:\n%s\n%s", row->covers, b->source, b->check_out);
    if (row->obs == OBS_REFUSED) {
        cr_expect_eq(v->check_rc, 1, "[%s] the variant should be refused by kiln check, exit %d:\n%s\n%s", row->covers, v->check_rc,
                     v->source, v->check_out);
        cr_expect(strstr(v->check_out, "/models/") && strstr(v->check_out, ": error: "),
                  "[%s] the refusal is not a located error:\n%s", row->covers, v->check_out);
        return;
    }
    cr_assert_eq(v->check_rc, 0, "[%s] the variant does not compile:\n%s\n%s", row->covers, v->source, v->check_out);
    /* 1. The flattened recipe the program receives. */
    char *fb = flat_value(b->flat, row->flat), *fv = flat_value(v->flat, row->flat);
    cr_expect(!fb || !fv || strcmp(fb, fv), "[%s] recipe entry %s is the same with and without the change: %s", row->covers,
              row->flat, fb ? fb : "(absent)");
    cr_expect(fb || fv, "[%s] recipe entry %s is absent from both programs", row->covers, row->flat);
    free(fb);
    free(fv);
    /* 2. What the program does (or, for a compile-time setting, what kiln plans). */
    if (row->obs == OBS_PLAN) {
        const char *pb = strstr(b->check_out, "memory at the bounds"), *pv = strstr(v->check_out, "memory at the bounds");
        cr_expect(pb, "[%s] the base's kiln check prints no memory plan:\n%s", row->covers, b->check_out);
        if (!pv) pv = strstr(v->check_out, "(no memory plan: ");
        cr_expect(pv, "[%s] the variant's kiln check prints no memory plan:\n%s", row->covers, v->check_out);
        cr_expect(!pb || !pv || strcmp(pb, pv), "[%s] the memory plan is the same with and without the change:\n%s", row->covers, pb);
        return;
    }
    if (row->obs == OBS_WARNING) {
        cr_expect(!strstr(b->build_out, ": warning: "), "[%s] the base warns:\n%s", row->covers, b->build_out);
        cr_expect(strstr(v->build_out, ": warning: ") && strstr(v->build_out, "has no effect yet"),
                  "[%s] kiln build does not warn that it has no effect yet:\n%s", row->covers, v->build_out);
    }
    if (row->pending) {
        cr_log_info("[%s] behavioural check pending: %s", row->covers, row->pending);
        return;
    }
    if (row->runtime && row->runtime != runtime) {
        cr_log_info("[%s] behavioural check pending: needs a training program with %s", row->covers, rt_name[row->runtime]);
        return;
    }
    Run rb = run_program(b), rv = run_program(v);
    if (expects_success(row->obs)) {
        cr_expect_eq(rb.rc, 0, "[%s] the base program failed:\n%s\n%s", row->covers, b->source, rb.out);
        cr_expect_eq(rv.rc, 0, "[%s] the variant program failed:\n%s\n%s", row->covers, v->source, rv.out);
    }
    char *ob = observe(row, &rb), *ov = observe(row, &rv);
    cr_expect(*ob || *ov, "[%s] nothing to compare: no %s in either run:\n%s", row->covers, obs_name[row->obs], rb.out);
    cr_expect(strcmp(ob, ov), "[%s] the %s are the same with and without the change:\n%s\n--- base:\n%s\n--- variant:\n%s",
              row->covers, obs_name[row->obs], ob, b->source, v->source);
    free(ob);
    free(ov);
    run_free(&rb);
    run_free(&rv);
}

static void free_cache(void)
{
    for (int i = 0; i < ncache; i++) {
        free(cache[i].source);
        free(cache[i].check_out);
        free(cache[i].build_out);
        free(cache[i].flat);
    }
    ncache = 0;
    support_remove_dir(root);
}

TestSuite(recipe, .timeout = 600);

/* Every key and argument of the schema has a row. */
Test(recipe, every_schema_item_has_a_row)
{
    StrBuf items;
    sb_init(&items);
    recipe_schema(&items);
    int n = 0;
    for (const char *p = items.data; p && *p;) {
        size_t len = strcspn(p, "\n");
        bool found = false;
        for (int i = 0; i < NROWS && !found; i++)
            for (const char *c = rows[i].covers; *c && !found;) {
                size_t cl = strcspn(c, " ");
                found = cl == len && !strncmp(c, p, len);
                c += cl + (c[cl] == ' ');
            }
        cr_expect(found, "recipe item %.*s has no row in tests/test_recipe.c", (int)len, p);
        n++;
        p += len + (p[len] == '\n');
    }
    cr_expect_gt(n, 40, "recipe_schema() lists only %d items", n);
    sb_free(&items);
}

/* Each row, in the flattened recipe and in the program's behaviour. */
Test(recipe, every_key_and_argument_has_an_effect)
{
    make_data();
    runtime = detect_runtime();
    cr_log_info("the training program writes %s", rt_name[runtime]);
    for (int i = 0; i < NROWS; i++) check_row(&rows[i]);
    free_cache();
}

/* ---- warnings: settings accepted but not implemented yet ---- */

static void check_warning_file(const char *name)
{
    char rel[256], args[1024];
    snprintf(rel, sizeof rel, "tests/warn/%s.expected", name);
    size_t n;
    char *want = support_read(rel, &n);
    cr_assert(want, "missing %s", rel);
    /* kiln check: exactly the expected lines on stderr (stdout is the model summary). */
    StrBuf out;
    sb_init(&out);
    snprintf(args, sizeof args, "( cd '%s' && '%s' check tests/warn/%s.kiln 2>&1 >/dev/null )", KILN_SOURCE_DIR, KILN_BINARY, name);
    int rc = support_run(args, &out);
    cr_expect_eq(rc, 0, "kiln check tests/warn/%s.kiln: exit %d:\n%s", name, rc, out.data);
    cr_expect_str_eq(out.data ? out.data : "", want, "kiln check tests/warn/%s.kiln: stderr differs from %s\nfound:\n%s", name, rel,
                     out.data ? out.data : "");
    /* kiln build: the same warnings, once, then the program. */
    char dir[] = "/tmp/kiln-warn-XXXXXX";
    cr_assert(mkdtemp(dir));
    sb_free(&out);
    sb_init(&out);
    snprintf(args, sizeof args, "cd '%s' && '%s' build tests/warn/%s.kiln -o %s/prog", KILN_SOURCE_DIR, KILN_BINARY, name, dir);
    rc = support_run(args, &out);
    StrBuf expect;
    sb_init(&expect);
    sb_printf(&expect, "%skiln: built %s/prog\n", want, dir);
    cr_expect_eq(rc, 0, "kiln build tests/warn/%s.kiln: exit %d:\n%s", name, rc, out.data);
    cr_expect_str_eq(out.data ? out.data : "", expect.data, "kiln build tests/warn/%s.kiln: output differs\nexpected:\n%s\nfound:\n%s",
                     name, expect.data, out.data ? out.data : "");
    sb_free(&expect);
    sb_free(&out);
    support_remove_dir(dir);
    free(want);
}

/* mixed precision works now (passes/precision.c): no warning */
Test(warnings, precision_bf16_needs_no_warning) { check_warning_file("precision_bf16"); }
Test(warnings, precision_f32_needs_no_warning) { check_warning_file("precision_f32"); }
/* checkpoint(...) works now (passes/remat.c): no warning */
Test(warnings, checkpoint_in_forward_needs_no_warning) { check_warning_file("checkpoint_in_forward"); }
/* not a setting: NaN that the compiler can see before anything runs */
Test(warnings, nan_the_compiler_can_see) { check_warning_file("nan_visible"); }

/* ---- the typed recipe reaches the program: every schema item, every value ----
 * The checker's schema (recipe_schema) and the program's typed recipe come from one table
 * (runtime/kiln_recipe.h): a program built from a recipe that writes non-default values
 * prints each item of the schema by --print-recipe, with the written value, and with the
 * value a flag writes over it. A key known to the checker but not carried into model.c,
 * or not read back by the program, fails here. */

static const char *const roundtrip_cls =
    "data = npy(x = \"x.npy\", y = \"y.npy\")\n"
    "eval_data = npy(x = \"ex.npy\", y = \"ey.npy\")\n"
    "optimizer = SGD(lr = 0.25, momentum = 0.5, dampening = 0.125, weight_decay = 0.75, decay = all)\n"
    "schedule = onecycle(pct_start = 0.5, anneal_strategy = linear, div_factor = 5, final_div_factor = 50, three_phase = true)\n"
    "groups = [group(\"fc1.*\", lr = 0.375, weight_decay = 0.625)]\n"
    "batch = 8\nsteps = 6\nclip = 2.5\naccumulate = 3\nseed = 77\n"
    "precision = fp16\nloss_scale_init = 1024\nloss_scale_growth_interval = 7\nmemory_budget = \"64MiB\"\n"
    "checkpoint = every(steps = 3, epochs = 2, dir = \"cks\", keep = 4)\n"
    "eval = every(steps = 2, epochs = 3, batches = 5)\n"
    "log = \"l.jsonl\"\n";
static const char *const roundtrip_cls_lines[] = {
    "data = npy", "data.x = \"x.npy\"", "data.y = \"y.npy\"", "eval_data = npy", "eval_data.x = \"ex.npy\"", "optimizer = SGD",
    "optimizer.lr = 0.25", "optimizer.momentum = 0.5", "optimizer.dampening = 0.125", "optimizer.weight_decay = 0.75",
    "optimizer.decay = all", "schedule = onecycle", "schedule.pct_start = 0.5", "schedule.anneal_strategy = linear",
    "schedule.div_factor = 5", "schedule.final_div_factor = 50", "schedule.three_phase = true", "groups = 1",
    "groups.0.pattern = \"fc1.*\"", "groups.0.lr = 0.375", "groups.0.weight_decay = 0.625", "groups.0.params = \"fc1.weight\"",
    "batch = 8", "steps = 6", "clip = 2.5", "accumulate = 3", "seed = 77", "precision = fp16", "loss_scale = dynamic",
    "loss_scale_init = 1024", "loss_scale_growth_interval = 7", "memory_budget = \"64MiB\"", "checkpoint = every",
    "checkpoint.steps = 3", "checkpoint.epochs = 2", "checkpoint.dir = \"cks\"", "checkpoint.keep = 4", "eval = every",
    "eval.steps = 2", "eval.epochs = 3", "eval.batches = 5", "log = \"l.jsonl\"", NULL};
/* Flags write over the recipe's fields. */
static const char *const roundtrip_flags =
    "--lr 0.5 --batch 4 --seed 9 --steps 12 --checkpoint-every 0 --checkpoint-dir ck2 --checkpoint-keep 6 --eval-every 7 "
    "--eval-batches 2 --log l2.jsonl --limit 11 --tensorboard tb --data x=x2.npy --eval-data y=ey2.npy";
static const char *const roundtrip_flag_lines[] = {
    "optimizer.lr = 0.5", "batch = 4", "seed = 9", "steps = 12", "checkpoint.steps = 0", "checkpoint.epochs = 1",
    "checkpoint.dir = \"ck2\"", "checkpoint.keep = 6", "eval.steps = 7", "eval.epochs = 0", "eval.batches = 2",
    "log = \"l2.jsonl\"", "limit = 11", "tensorboard = \"tb\"", "data.x = \"x2.npy\"", "data.y = \"y.npy\"",
    "eval_data.x = \"ex.npy\"", "eval_data.y = \"ey2.npy\"", NULL};
static const char *const roundtrip_lm =
    "data = text(\"c/*.txt\", exclude = \"*.md\", input = idx, target = targets, val = 0.25)\n"
    "optimizer = Lion(lr = 0.003, betas = [0.5, 0.75], weight_decay = 0.5)\n"
    "schedule = cosine_restarts(T_0 = 3, T_mult = 2, eta_min = 0.001, warmup = 1)\n"
    "batch = 2\nsteps = 5\nprecision = bf16\nweight_rounding = stochastic\n"
    "sample = generate(tokens = 7, temperature = 0.5, top_k = 3, prompt = \"hi\\n\")\n";
static const char *const roundtrip_lm_lines[] = {
    "data = text", "data.path = \"c/*.txt\"", "data.exclude = \"*.md\"", "data.input = \"idx\"", "data.target = \"targets\"",
    "data.val = 0.25", "optimizer = Lion", "optimizer.lr = 0.003", "optimizer.betas = [0.5, 0.75]", "optimizer.weight_decay = 0.5",
    "schedule = cosine_restarts", "schedule.T_0 = 3", "schedule.T_mult = 2", "schedule.eta_min = 0.001", "schedule.warmup = 1",
    "precision = bf16", "weight_rounding = stochastic", "loss_scale = none", "sample = generate", "sample.tokens = 7",
    "sample.temperature = 0.5", "sample.top_k = 3", "sample.prompt = \"hi\\n\"", NULL};

/* Builds a model of `which` with `train` into dir and prints its recipe with `flags`. */
static char *print_recipe(const char *dir, int which, const char *train, const char *flags)
{
    char path[512], args[1024];
    snprintf(path, sizeof path, "%s/%s.kiln", dir, model_name[which]);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fprintf(f, model_text[which], train);
    fclose(f);
    StrBuf out;
    sb_init(&out);
    snprintf(args, sizeof args, "build %s -o %s/%s --cflags -O0", path, dir, model_name[which]);
    cr_assert_eq(support_run_kiln(args, &out), 0, "kiln %s:\n%s", args, out.data);
    snprintf(args, sizeof args, "./%s --print-recipe %s", model_name[which], flags);
    cr_assert_eq(support_run_in(dir, args, &out), 0, "%s:\n%s", args, out.data);
    return out.data ? sb_take(&out) : calloc(1, 1);
}

static bool has_line(const char *text, const char *line)
{
    size_t n = strlen(line);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (!strncmp(p, line, n) && (p[n] == '\n' || !p[n])) return true;
    return false;
}

static void expect_lines(const char *text, const char *const *lines, const char *what)
{
    for (int i = 0; lines[i]; i++) cr_expect(has_line(text, lines[i]), "%s: --print-recipe has no line `%s`:\n%s", what, lines[i], text);
}

Test(recipe, every_schema_item_reaches_the_program)
{
    char dir[] = "/tmp/kiln-roundtrip-XXXXXX";
    cr_assert(mkdtemp(dir));
    char *cls = print_recipe(dir, CLS, roundtrip_cls, "");
    expect_lines(cls, roundtrip_cls_lines, "the recipe's values");
    char *flagged = print_recipe(dir, CLS, roundtrip_cls, roundtrip_flags);
    expect_lines(flagged, roundtrip_flag_lines, "the flags' values");
    char *lm = print_recipe(dir, LM, roundtrip_lm, "");
    expect_lines(lm, roundtrip_lm_lines, "a language model's recipe");
    /* Each item of the checker's schema, by the name the program prints it with. */
    StrBuf items;
    sb_init(&items);
    recipe_schema(&items);
    int n = 0;
    for (const char *p = items.data; p && *p; n++) {
        size_t len = strcspn(p, "\n");
        char item[128], name[160];
        snprintf(item, sizeof item, "%.*s", (int)len, p);
        char *eq = strchr(item, '='), *dot = eq ? strchr(eq, '.') : NULL;
        if (!eq) snprintf(name, sizeof name, "%s = ", item); /* a key */
        else {
            *eq = 0;
            const char *arg = dot + 1;
            if (!strcmp(arg, "INPUT")) snprintf(name, sizeof name, "%s.x = ", item); /* the model's input x */
            else if (!strcmp(item, "groups")) snprintf(name, sizeof name, "groups.0.%s = ", arg);
            else snprintf(name, sizeof name, "%s.%s = ", item, arg);
        }
        bool found = false;
        for (const char *q = cls; q && *q && !found; q = strchr(q, '\n'), q = q ? q + 1 : NULL) found = !strncmp(q, name, strlen(name));
        cr_expect(found, "schema item %.*s: --print-recipe prints no `%s...`:\n%s", (int)len, p, name, cls);
        p += len + (p[len] == '\n');
    }
    cr_expect_gt(n, 40);
    sb_free(&items);
    free(cls);
    free(flagged);
    free(lm);
    support_remove_dir(dir);
}
