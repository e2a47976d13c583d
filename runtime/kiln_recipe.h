/* kiln_recipe.h — the training recipe (a model's `train { ... }` section), declared once as
 * X-macro tables, as ir/ops.h declares the ops: every key with its kind, default and range,
 * every call a call-valued key takes (optimizer = AdamW(...), schedule = cosine(...), ...)
 * with its arguments, and the typed struct `kiln_recipe` that carries a checked recipe into
 * the generated model.c. The frontend's checker (frontend/recipe.c) reads the tables to check
 * a file; the code generator (codegen/host.c) writes a `kiln_recipe` value; the programs
 * (programs/train_main.c, infer_main.c, ...) read its fields. A key added here is checked,
 * generated and readable at once; none can be known to one side only. Plain C (and C++ for
 * model.cu): no frontend types. */
#ifndef KILN_RECIPE_H
#define KILN_RECIPE_H

#include <stdbool.h>
#include <stdint.h>

/* ---- choices of name-valued keys and arguments: X(list, name), enum KILN_RECIPE_list_name ---- */
#define KILN_RECIPE_CHOICES_precision(X) X(precision, fp32) X(precision, bf16) X(precision, fp16) X(precision, f32) X(precision, f16)
#define KILN_RECIPE_CHOICES_weight_rounding(X) X(weight_rounding, nearest) X(weight_rounding, stochastic)
/* loss_scale: a name, or a number (a static scale: KILN_RECIPE_LOSS_SCALE_STATIC) */
#define KILN_RECIPE_CHOICES_loss_scale(X) X(loss_scale, dynamic) X(loss_scale, none)
#define KILN_RECIPE_CHOICES_decay(X) X(decay, matrices) X(decay, all)
#define KILN_RECIPE_CHOICES_anneal_strategy(X) X(anneal_strategy, cos) X(anneal_strategy, linear)
#define KILN_RECIPE_CHOICES_none(X) /* no list: a string, or a model input's name */
#define KILN_RECIPE_CHOICE_LISTS(L) L(precision) L(weight_rounding) L(loss_scale) L(decay) L(anneal_strategy)

#define KILN_RECIPE_ENUM_CHOICE_(list, name) KILN_RECIPE_##list##_##name,
#define KILN_RECIPE_ENUM_LIST_(list) enum { KILN_RECIPE_CHOICES_##list(KILN_RECIPE_ENUM_CHOICE_) KILN_RECIPE_N_##list };
KILN_RECIPE_CHOICE_LISTS(KILN_RECIPE_ENUM_LIST_)
#define KILN_RECIPE_LOSS_SCALE_STATIC KILN_RECIPE_N_loss_scale

/* ---- arguments of each call: A(key, arg, kind, default, lo, hi, choices) ----
 * kind: NUM, INT, STR, NAME (a model input's name, or one of `choices`), BOOL, PAIR (two
 * numbers). default: the value as text; NULL = required; "" = optional, no value. choices:
 * a KILN_RECIPE_CHOICES_ list's name, or none. Ranges are inclusive; KILN_RECIPE_INF = none. */
#define KILN_RECIPE_INF 1e300
#define KILN_RECIPE_MAX_SCALE 1.7014118346046923e38 /* 2^127: a scale fp32 holds, with room to double */

#define KILN_RECIPE_ARGS_text(A)                                                                                                  \
    A(data, path, STR, NULL, 0, 0, none) A(data, input, NAME, NULL, 0, 0, none) A(data, target, NAME, NULL, 0, 0, none)          \
    A(data, val, NUM, "0.1", 0, 0.9, none) A(data, exclude, STR, "", 0, 0, none)
#define KILN_RECIPE_ARGS_tokens(A)                                                                                                \
    A(data, path, STR, NULL, 0, 0, none) A(data, input, NAME, NULL, 0, 0, none) A(data, target, NAME, NULL, 0, 0, none)          \
    A(data, val, NUM, "0.1", 0, 0.9, none)
#define KILN_RECIPE_ARGS_map(A) A(data, val, NUM, "0.0", 0, 0.9, none)
#define KILN_RECIPE_ARGS_eval_map(A) A(eval_data, val, NUM, "0.0", 0, 0.9, none)
/* Learning rates have no upper bound (PyTorch has none); the checker wants them above 0. */
#define KILN_RECIPE_ARGS_SGD(A)                                                                                                   \
    A(optimizer, lr, NUM, "0.01", 0, KILN_RECIPE_INF, none) A(optimizer, momentum, NUM, "0.0", 0, 1, none)                        \
    A(optimizer, dampening, NUM, "0.0", 0, 1, none) A(optimizer, nesterov, BOOL, "false", 0, 0, none)                             \
    A(optimizer, weight_decay, NUM, "0.0", 0, 10, none) A(optimizer, decay, NAME, "matrices", 0, 0, decay)
#define KILN_RECIPE_ARGS_Adam(A)                                                                                                  \
    A(optimizer, lr, NUM, "0.001", 0, KILN_RECIPE_INF, none) A(optimizer, betas, PAIR, "0.9 0.999", 0, 1, none)                   \
    A(optimizer, eps, NUM, "1e-8", 0, 1, none) A(optimizer, weight_decay, NUM, "0.0", 0, 10, none)                                \
    A(optimizer, amsgrad, BOOL, "false", 0, 0, none) A(optimizer, decay, NAME, "matrices", 0, 0, decay)
#define KILN_RECIPE_ARGS_AdamW(A)                                                                                                 \
    A(optimizer, lr, NUM, "0.001", 0, KILN_RECIPE_INF, none) A(optimizer, betas, PAIR, "0.9 0.999", 0, 1, none)                   \
    A(optimizer, eps, NUM, "1e-8", 0, 1, none) A(optimizer, weight_decay, NUM, "0.01", 0, 10, none)                               \
    A(optimizer, amsgrad, BOOL, "false", 0, 0, none) A(optimizer, decay, NAME, "matrices", 0, 0, decay)
#define KILN_RECIPE_ARGS_RMSprop(A)                                                                                               \
    A(optimizer, lr, NUM, "0.01", 0, KILN_RECIPE_INF, none) A(optimizer, alpha, NUM, "0.99", 0, 1, none)                          \
    A(optimizer, eps, NUM, "1e-8", 0, 1, none) A(optimizer, weight_decay, NUM, "0.0", 0, 10, none)                                \
    A(optimizer, momentum, NUM, "0.0", 0, 1, none) A(optimizer, centered, BOOL, "false", 0, 0, none)                              \
    A(optimizer, decay, NAME, "matrices", 0, 0, decay)
#define KILN_RECIPE_ARGS_Adagrad(A)                                                                                               \
    A(optimizer, lr, NUM, "0.01", 0, KILN_RECIPE_INF, none) A(optimizer, lr_decay, NUM, "0.0", 0, KILN_RECIPE_INF, none)          \
    A(optimizer, weight_decay, NUM, "0.0", 0, 10, none)                                                                          \
    A(optimizer, initial_accumulator_value, NUM, "0.0", 0, KILN_RECIPE_INF, none) A(optimizer, eps, NUM, "1e-10", 0, 1, none)     \
    A(optimizer, decay, NAME, "matrices", 0, 0, decay)
#define KILN_RECIPE_ARGS_Lion(A)                                                                                                  \
    A(optimizer, lr, NUM, "0.0001", 0, KILN_RECIPE_INF, none) A(optimizer, betas, PAIR, "0.9 0.99", 0, 1, none)                   \
    A(optimizer, weight_decay, NUM, "0.0", 0, 10, none) A(optimizer, decay, NAME, "matrices", 0, 0, decay)
/* Parameter groups (torch.optim's param_groups): a name pattern as init rules take it,
 * and the lr and/or weight_decay of the parameters it matches. */
#define KILN_RECIPE_ARGS_group(A)                                                                                                 \
    A(groups, pattern, STR, NULL, 0, 0, none) A(groups, lr, NUM, "", 0, KILN_RECIPE_INF, none)                                    \
    A(groups, weight_decay, NUM, "", 0, 10, none)
#define KILN_RECIPE_ARGS_constant(A) A(schedule, warmup, INT, "0", 0, KILN_RECIPE_INF, none)
#define KILN_RECIPE_ARGS_step(A)                                                                                                  \
    A(schedule, step_size, INT, NULL, 1, KILN_RECIPE_INF, none) A(schedule, gamma, NUM, "0.1", 0, 1, none)                        \
    A(schedule, warmup, INT, "0", 0, KILN_RECIPE_INF, none)
#define KILN_RECIPE_ARGS_decay(A) A(schedule, warmup, INT, "0", 0, KILN_RECIPE_INF, none) A(schedule, min_lr, NUM, "0.0", 0, 10, none)
#define KILN_RECIPE_ARGS_onecycle(A)                                                                                              \
    A(schedule, max_lr, NUM, "", 0, KILN_RECIPE_INF, none) A(schedule, pct_start, NUM, "0.3", 0, 1, none)                         \
    A(schedule, anneal_strategy, NAME, "cos", 0, 0, anneal_strategy)                                                              \
    A(schedule, div_factor, NUM, "25", 1e-12, KILN_RECIPE_INF, none)                                                              \
    A(schedule, final_div_factor, NUM, "1e4", 1e-12, KILN_RECIPE_INF, none) A(schedule, three_phase, BOOL, "false", 0, 0, none)
#define KILN_RECIPE_ARGS_exponential(A) A(schedule, gamma, NUM, NULL, 0, 1, none) A(schedule, warmup, INT, "0", 0, KILN_RECIPE_INF, none)
#define KILN_RECIPE_ARGS_polynomial(A)                                                                                            \
    A(schedule, power, NUM, "1.0", 0, KILN_RECIPE_INF, none) A(schedule, total_iters, INT, "0", 0, KILN_RECIPE_INF, none)         \
    A(schedule, warmup, INT, "0", 0, KILN_RECIPE_INF, none)
#define KILN_RECIPE_ARGS_restarts(A)                                                                                              \
    A(schedule, T_0, INT, NULL, 1, KILN_RECIPE_INF, none) A(schedule, T_mult, INT, "1", 1, 1000, none)                            \
    A(schedule, eta_min, NUM, "0.0", 0, KILN_RECIPE_INF, none) A(schedule, warmup, INT, "0", 0, KILN_RECIPE_INF, none)
#define KILN_RECIPE_ARGS_ckpt(A)                                                                                                  \
    A(checkpoint, steps, INT, "0", 0, KILN_RECIPE_INF, none) A(checkpoint, epochs, INT, "1", 0, KILN_RECIPE_INF, none)            \
    A(checkpoint, dir, STR, "checkpoints", 0, 0, none) A(checkpoint, keep, INT, "2", 1, 1000, none)
#define KILN_RECIPE_ARGS_eval(A)                                                                                                  \
    A(eval, steps, INT, "0", 0, KILN_RECIPE_INF, none) A(eval, epochs, INT, "1", 0, KILN_RECIPE_INF, none)                        \
    A(eval, batches, INT, "0", 0, KILN_RECIPE_INF, none)
#define KILN_RECIPE_ARGS_sample(A)                                                                                                \
    A(sample, tokens, INT, "200", 0, 100000, none) A(sample, temperature, NUM, "0.8", 1e-3, 100, none)                            \
    A(sample, top_k, INT, "40", 0, 1e9, none) A(sample, prompt, STR, "\n", 0, 0, none)

/* ---- the calls of each call-valued key: C(key, call, args, input_map, doc) ----
 * input_map: keyword arguments are model inputs mapped to file paths (the key's _files). */
#define KILN_RECIPE_CALLS(C)                                                                                                      \
    C(data, idx, map, 1, "IDX files (plain or .gz), one per input: idx(image = \"...\", label = \"...\")")                       \
    C(data, npy, map, 1, "NumPy .npy files, one per input")                                                                     \
    C(data, text, text, 0, "raw bytes of text files (a glob, minus an exclude glob, sorted by name), windows of input and next-byte target") \
    C(data, tokens, tokens, 0, "a token file (docs/formats.md), windows of input and next-token target")                         \
    C(eval_data, idx, eval_map, 1, "IDX files (plain or .gz), one per input, all evaluated")                                    \
    C(eval_data, npy, eval_map, 1, "NumPy .npy files, one per input, all evaluated")                                            \
    C(optimizer, SGD, SGD, 0, "stochastic gradient descent with optional (Nesterov) momentum")                                  \
    C(optimizer, Adam, Adam, 0, "Adam; weight_decay is L2 added to the gradient; amsgrad keeps the largest second moments")     \
    C(optimizer, AdamW, AdamW, 0, "Adam with decoupled weight decay (on >= 2-D parameters unless decay = all)")                 \
    C(optimizer, RMSprop, RMSprop, 0, "RMSprop (optionally centred, with momentum); weight_decay is L2")                        \
    C(optimizer, Adagrad, Adagrad, 0, "Adagrad; weight_decay is L2")                                                            \
    C(optimizer, Lion, Lion, 0, "Lion (sign of the interpolated momentum) with decoupled weight decay")                         \
    C(schedule, constant, constant, 0, "constant learning rate after a linear warmup")                                          \
    C(schedule, step, step, 0, "multiply by gamma every step_size steps")                                                       \
    C(schedule, linear, decay, 0, "linear warmup, then linear decay to min_lr")                                                 \
    C(schedule, cosine, decay, 0, "linear warmup, then cosine decay to min_lr")                                                 \
    C(schedule, onecycle, onecycle, 0, "OneCycleLR over the run's steps, peaking at max_lr (default: the optimizer's lr)")       \
    C(schedule, exponential, exponential, 0, "ExponentialLR: multiply by gamma every step")                                     \
    C(schedule, polynomial, polynomial, 0, "PolynomialLR: decay to 0 over total_iters steps (0: the run's steps)")               \
    C(schedule, cosine_restarts, restarts, 0, "CosineAnnealingWarmRestarts, stepped every step")                                \
    C(groups, group, group, 0, "the parameters a pattern matches, with their own lr and/or weight_decay")                       \
    C(checkpoint, every, ckpt, 0, "save every N steps and/or epochs")                                                           \
    C(eval, every, eval, 0, "evaluate every N steps and/or epochs (batches = 0: all)")                                          \
    C(sample, generate, sample, 0, "language models: a sample printed at each evaluation")

/* One enum over all calls: a call-valued field holds KILN_RECIPE_CALL_key_call, or
 * KILN_RECIPE_CALL_NONE when the key is absent. */
#define KILN_RECIPE_ENUM_CALL_(key, call, args, map, doc) KILN_RECIPE_CALL_##key##_##call,
enum { KILN_RECIPE_CALL_NONE = -1, KILN_RECIPE_CALLS(KILN_RECIPE_ENUM_CALL_) KILN_RECIPE_NCALLS };

/* ---- the keys: K(key, kind, default, lo, hi, choices, completed, doc) ----
 * kind: as arguments', or CALL (one of the key's calls), DATA (a call whose input-map
 * calls fill key_files), GROUPS (a list of group(...) calls), SCALE (a choice or a number).
 * default: NULL = none (absent unless written); "" = optional, no value. completed: the
 * default is written into the checked recipe `kiln check` prints (0: it depends on other
 * keys, and only the typed struct starts from it: fp16's loss scaling, whose keys the
 * checker refuses under another precision). */
#define KILN_RECIPE_KEYS(K)                                                                                                       \
    K(data, DATA, NULL, 0, 0, none, 1, "training data")                                                                         \
    K(eval_data, DATA, NULL, 0, 0, none, 1, "evaluation data (default: the loader's val split)")                                \
    K(optimizer, CALL, "AdamW", 0, 0, none, 1, "SGD, Adam, AdamW, RMSprop, Adagrad or Lion with their hyperparameters")          \
    K(schedule, CALL, "constant", 0, 0, none, 1, "learning-rate schedule")                                                      \
    K(groups, GROUPS, NULL, 0, 0, none, 1, "parameter groups: [group(\"PATTERN\", lr = ..., weight_decay = ...), ...]")          \
    K(batch, INT, "64", 1, 1 << 24, none, 1, "samples per step (bounds the batch size symbol)")                                 \
    K(epochs, INT, "1", 1, 1e9, none, 1, "passes over the training data")                                                       \
    K(steps, INT, "", 1, 1e12, none, 1, "optimizer steps (overrides epochs)")                                                   \
    K(clip, NUM, "0.0", 0, 1e12, none, 1, "global gradient-norm clipping (0 = off)")                                            \
    K(accumulate, INT, "1", 1, 65536, none, 1, "micro-batches per optimizer step")                                              \
    K(precision, NAME, "fp32", 0, 0, precision, 1, "fp32, or mixed precision with bf16 / fp16 (kiln build --precision)")          \
    K(weight_rounding, NAME, "nearest", 0, 0, weight_rounding, 1,                                                                \
      "bf16: the training step's bf16 copies of the weights rounded from the fp32 masters to nearest (autocast's) or "         \
      "stochastically (llm.c's; kiln build --weight-rounding)")                                                                 \
    K(loss_scale, SCALE, "dynamic", 0, KILN_RECIPE_MAX_SCALE, loss_scale, 0,                                                    \
      "fp16: dynamic (GradScaler's), none, or a number (a static scale); default dynamic for fp16, none otherwise")             \
    K(loss_scale_init, NUM, "65536", 0, KILN_RECIPE_MAX_SCALE, none, 0, "fp16, loss_scale = dynamic: the first scale (default 65536)") \
    K(loss_scale_growth_interval, INT, "2000", 1, 1e9, none, 0,                                                                  \
      "fp16, loss_scale = dynamic: clean steps before the scale doubles (default 2000)")                                        \
    K(memory_budget, STR, NULL, 0, 0, none, 1, "training memory to fit by recomputing blocks, e.g. \"1.5GiB\" (kiln build --memory-budget)") \
    K(checkpoint, CALL, "every", 0, 0, none, 1, "checkpoint policy")                                                            \
    K(eval, CALL, "every", 0, 0, none, 1, "evaluation policy")                                                                  \
    K(seed, INT, "0", 0, 1e18, none, 1, "seed of initialisation, shuffling and dropout")                                        \
    K(sample, CALL, NULL, 0, 0, none, 1, "text generation at each evaluation (language models)")                                \
    K(log, STR, "", 0, 0, none, 1, "JSONL metrics log file")

/* ---- the fields that call arguments fill: F(field, kind, choices, value when the call has none) ----
 * One field per key and argument name, shared by every call that takes it (optimizer_lr
 * is SGD's and Adam's); the value here is what a program reads when the recipe's call
 * takes no such argument (the AdamW's momentum). Each argument above must have its field
 * (frontend/recipe.c takes its offsetof: a missing one does not compile). */
#define KILN_RECIPE_FIELDS(F)                                                                                                     \
    F(data_path, STR, none, NULL) F(data_input, STR, none, NULL) F(data_target, STR, none, NULL) F(data_val, NUM, none, 0)                            \
    F(data_exclude, STR, none, "") F(eval_data_val, NUM, none, 0)                                                                           \
    F(optimizer_lr, NUM, none, 1e-3) F(optimizer_momentum, NUM, none, 0) F(optimizer_dampening, NUM, none, 0) F(optimizer_nesterov, BOOL, none, false)  \
    F(optimizer_weight_decay, NUM, none, 0) F(optimizer_decay, NAME, decay, KILN_RECIPE_decay_matrices)                                      \
    F(optimizer_betas, PAIR, none, KILN_RECIPE_PAIR_INIT(0.9, 0.999)) F(optimizer_eps, NUM, none, 1e-8) F(optimizer_amsgrad, BOOL, none, false)   \
    F(optimizer_alpha, NUM, none, 0.99) F(optimizer_centered, BOOL, none, false) F(optimizer_lr_decay, NUM, none, 0)                              \
    F(optimizer_initial_accumulator_value, NUM, none, 0)                                                                              \
    F(schedule_warmup, INT, none, 0) F(schedule_step_size, INT, none, 1) F(schedule_gamma, NUM, none, 0.1) F(schedule_min_lr, NUM, none, 0)             \
    F(schedule_max_lr, NUM, none, 0) F(schedule_pct_start, NUM, none, 0.3) F(schedule_anneal_strategy, NAME, anneal_strategy, KILN_RECIPE_anneal_strategy_cos) \
    F(schedule_div_factor, NUM, none, 25) F(schedule_final_div_factor, NUM, none, 1e4) F(schedule_three_phase, BOOL, none, false)                 \
    F(schedule_power, NUM, none, 1) F(schedule_total_iters, INT, none, 0) F(schedule_T_0, INT, none, 1) F(schedule_T_mult, INT, none, 1)                \
    F(schedule_eta_min, NUM, none, 0)                                                                                                 \
    F(checkpoint_steps, INT, none, 0) F(checkpoint_epochs, INT, none, 1) F(checkpoint_dir, STR, none, "checkpoints") F(checkpoint_keep, INT, none, 2)   \
    F(eval_steps, INT, none, 0) F(eval_epochs, INT, none, 1) F(eval_batches, INT, none, 0)                                                        \
    F(sample_tokens, INT, none, 0) F(sample_temperature, NUM, none, 0.8) F(sample_top_k, INT, none, 40) F(sample_prompt, STR, none, "\n")

/* ---- the typed recipe ---- */
typedef struct {
    const char *input, *path; /* a model input and its file */
} kiln_recipe_file;

typedef struct {
    const char *pattern;
    bool has_lr, has_weight_decay; /* the group sets them (else the optimizer's apply) */
    double lr, weight_decay;
    const char *const *params; /* the trainable parameters the pattern took, by state_dict name */
    int32_t nparams;
} kiln_recipe_group;

typedef struct {
    const kiln_recipe_file *v;
    int32_t n;
} kiln_recipe_files;

typedef struct {
    const kiln_recipe_group *v;
    int32_t n;
} kiln_recipe_groups;

#define KILN_RECIPE_PAIR_INIT(a, b) {a, b}
#define KILN_RECIPE_CTYPE_INT int64_t
#define KILN_RECIPE_CTYPE_NUM double
#define KILN_RECIPE_CTYPE_BOOL bool
#define KILN_RECIPE_CTYPE_STR const char *
#define KILN_RECIPE_CTYPE_NAME int32_t
#define KILN_RECIPE_CTYPE_CALL int32_t
#define KILN_RECIPE_CTYPE_GROUPS kiln_recipe_groups
#define KILN_RECIPE_FIELD_PAIR_(name) double name[2];
#define KILN_RECIPE_FIELD_DATA_(name) int32_t name; kiln_recipe_files name##_files;
#define KILN_RECIPE_FIELD_SCALE_(name) int32_t name; double name##_value; /* KILN_RECIPE_LOSS_SCALE_STATIC: the scale */
#define KILN_RECIPE_FIELD_PLAIN_(kind, name) KILN_RECIPE_CTYPE_##kind name;
#define KILN_RECIPE_FIELD_INT(name) KILN_RECIPE_FIELD_PLAIN_(INT, name)
#define KILN_RECIPE_FIELD_NUM(name) KILN_RECIPE_FIELD_PLAIN_(NUM, name)
#define KILN_RECIPE_FIELD_BOOL(name) KILN_RECIPE_FIELD_PLAIN_(BOOL, name)
#define KILN_RECIPE_FIELD_STR(name) KILN_RECIPE_FIELD_PLAIN_(STR, name)
#define KILN_RECIPE_FIELD_NAME(name) KILN_RECIPE_FIELD_PLAIN_(NAME, name)
#define KILN_RECIPE_FIELD_CALL(name) KILN_RECIPE_FIELD_PLAIN_(CALL, name)
#define KILN_RECIPE_FIELD_GROUPS(name) KILN_RECIPE_FIELD_PLAIN_(GROUPS, name)
#define KILN_RECIPE_FIELD_PAIR(name) KILN_RECIPE_FIELD_PAIR_(name)
#define KILN_RECIPE_FIELD_DATA(name) KILN_RECIPE_FIELD_DATA_(name)
#define KILN_RECIPE_FIELD_SCALE(name) KILN_RECIPE_FIELD_SCALE_(name)
#define KILN_RECIPE_KEY_FIELD_(key, kind, dflt, lo, hi, choices, completed, doc) KILN_RECIPE_FIELD_##kind(key)
#define KILN_RECIPE_ARG_FIELD_(name, kind, choices, unset) KILN_RECIPE_FIELD_##kind(name)

/* The recipe as model.c carries it: every key (absent ones at their defaults: a string
 * key's NULL, a call-valued key's KILN_RECIPE_CALL_NONE), then every call argument's
 * field (a key's call and its arguments: `optimizer` is KILN_RECIPE_CALL_optimizer_AdamW
 * and optimizer_lr its lr). Name-valued fields hold their KILN_RECIPE_list_name. */
typedef struct kiln_recipe {
    KILN_RECIPE_KEYS(KILN_RECIPE_KEY_FIELD_)
    KILN_RECIPE_FIELDS(KILN_RECIPE_ARG_FIELD_)
} kiln_recipe;

/* The name of call `id` (KILN_RECIPE_CALL_...; "" for none), as the recipe writes it. */
static inline const char *kiln_recipe_call_name(int32_t id)
{
#define KILN_RECIPE_CALL_NAME_(key, call, args, map, doc) #call,
    static const char *const names[] = {KILN_RECIPE_CALLS(KILN_RECIPE_CALL_NAME_) ""};
#undef KILN_RECIPE_CALL_NAME_
    return id >= 0 && id < KILN_RECIPE_NCALLS ? names[id] : "";
}

/* The name of choice `v` of a list (kiln_recipe_precision_name(r->precision): "bf16"). */
#define KILN_RECIPE_CHOICE_NAME_(list, name) #name,
#define KILN_RECIPE_CHOICE_FN_(list)                                                                                              \
    static inline const char *kiln_recipe_##list##_name(int32_t v)                                                                \
    {                                                                                                                             \
        static const char *const names[] = {KILN_RECIPE_CHOICES_##list(KILN_RECIPE_CHOICE_NAME_) ""};                             \
        return v >= 0 && v < KILN_RECIPE_N_##list ? names[v] : "";                                                               \
    }
KILN_RECIPE_CHOICE_LISTS(KILN_RECIPE_CHOICE_FN_)

/* Whether the data are a language model's token stream (text or tokens). */
static inline bool kiln_recipe_lm_data(const kiln_recipe *r)
{
    return r->data == KILN_RECIPE_CALL_data_text || r->data == KILN_RECIPE_CALL_data_tokens;
}

#endif
