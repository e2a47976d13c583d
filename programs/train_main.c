/* train_main.c — the training program: the main() of every generated one, and the
 * entry kiln train's JIT calls in the kiln process.
 *
 * It trains the model it is given (kiln_train_main: a built program's main passes its
 * kiln_model_def, from the generated model.c; `kiln train`'s JIT the model it linked) by
 * the recipe in the model file, which flags override: loads the data, initialises the
 * parameters (PyTorch's distributions, Kiln's counter-based stream), runs the steps with
 * the optimizer, schedule, clipping and accumulation, evaluates, logs, and saves and
 * resumes checkpoints (safetensors; one step directory each, published whole, the newest
 * K kept: ckpt_dir.c), or with --eval only evaluates. Every flag's value is checked, and a
 * flag that would do nothing is an error. Every failure is one message naming the file or
 * flag and what is wrong, and a non-zero exit; a checkpoint in place is never replaced by
 * a half-written one. Ctrl-C saves a checkpoint before exiting. */
#define _POSIX_C_SOURCE 200809L
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dist.h"
#include "kiln_model.h"
#include "kiln_rng.h"
#include "train_internal.h"

/* The model this process trains: kiln_train_main's (once per process: a built program's
 * kiln_model_def, or the model `kiln train` compiled into the kiln process). */
static const kiln_model *M;

const kiln_model *tm_model(void) { return M; }

static volatile sig_atomic_t interrupted;
static void on_sigint(int sig)
{
    (void)sig;
    interrupted = 1;
}

int tm_die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: error: ", M->name);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 1;
}

/* A computed index out of range stopped the step at its check (kiln_model.h): the error
 * names the model line, the layer, the value and the step (1-based; `when` says whether it
 * was the training step or an evaluation after that many steps). */
int tm_index_failed(const kiln_step_io *io, const char *when, int64_t step)
{
    const kiln_index_check *c = io->index_error;
    if (!c) return 0;
    fprintf(stderr, "%s:%u:%u: error: %s: index %lld out of range [0, %lld) (%s %lld)\n", M->source, c->line, c->col, c->what,
            (long long)io->index_value, (long long)c->limit, when, (long long)step);
    return 1;
}

/* ---- the recipe, overridden by flags ----
 * model.c's typed recipe (kiln_recipe.h) copied into the program's options, where each
 * flag writes its field; the flags that are the program's alone beside it. */

#define MAX_FILES 256 /* --data / --eval-data INPUT=PATH flags, with the recipe's files */
typedef struct {
    kiln_recipe r;
    int64_t limit;           /* --limit N: the first N training samples (0: all) */
    const char *tensorboard; /* --tensorboard DIR, or "" */
    int64_t bench_steps;     /* --bench-steps N (0: none) */
    bool bench_profile, eval_only, print_recipe;
    bool given[32];          /* by flag (flags[]): the flag was given */
    kiln_recipe_file data_files[MAX_FILES], eval_files[MAX_FILES];
} Options;

static Options OPT;
static const kiln_recipe *const R = &OPT.r;

bool tm_bench_profile(void) { return OPT.bench_profile; }

/* Whole numbers exactly (a seed above 2^53 would lose bits through a double). */
static int64_t parse_int(const char *v)
{
    char *end;
    errno = 0;
    long long n = strtoll(v, &end, 10);
    return !*end && !errno ? (int64_t)n : (int64_t)strtod(v, NULL);
}

/* The file of model input `input` in files, or NULL. */
static const char *file_of(const kiln_recipe_files *files, const char *input)
{
    for (int32_t i = 0; i < files->n; i++)
        if (!strcmp(files->v[i].input, input)) return files->v[i].path;
    return NULL;
}

/* INPUT=PATH into files (kept in store, at most MAX_FILES): replaces the input's file. */
static int set_file(kiln_recipe_files *files, kiln_recipe_file *store, const char *input, size_t len, const char *path)
{
    if (files->v != store) { /* the recipe's (model.c's, read-only) first */
        for (int32_t i = 0; i < files->n && i < MAX_FILES; i++) store[i] = files->v[i];
        files->v = store;
    }
    for (int32_t i = 0; i < files->n; i++)
        if (strlen(files->v[i].input) == len && !strncmp(files->v[i].input, input, len)) {
            store[i].path = path;
            return 0;
        }
    if (files->n == MAX_FILES) return 1;
    for (int k = 0; k < M->ninputs; k++) /* the input's name as the model has it (input is INPUT=PATH) */
        if (strlen(M->inputs[k].name) == len && !strncmp(M->inputs[k].name, input, len)) store[files->n].input = M->inputs[k].name;
    store[files->n++].path = path;
    return 0;
}

/* What a flag's value must be. The ranges follow the recipe's (frontend/recipe.c). */
typedef enum { F_INT, F_NUM, F_STR, F_SWITCH } FlagKind;
/* The modes a flag acts in: training, --eval. A flag given in a mode where it would do
 * nothing is an error, so that no flag is silently ignored. (--bench-steps runs a
 * training step on random inputs and accepts the training flags.) */
enum { TRAIN = 1, EVAL = 2, BOTH = 3 };

typedef struct {
    const char *flag, *key, *help; /* key: the recipe's name of what it sets, for --help */
    FlagKind kind;
    double lo, hi;     /* F_INT, F_NUM: the allowed range */
    const char *unit;  /* F_INT: what N counts, for messages */
    int modes;
    size_t field; /* where it writes in Options (offsetof; --data and the like: 0, handled apart) */
} Flag;
#define R_(f) offsetof(Options, r.f)
#define O_(f) offsetof(Options, f)

static const Flag flags[] = {
    {"--epochs", "epochs", "passes over the training data", F_INT, 1, 1e9, "epochs", TRAIN, R_(epochs)},
    {"--steps", "steps", "optimizer steps (overrides --epochs)", F_INT, 1, 1e12, "steps", TRAIN, R_(steps)},
    {"--batch", "batch", "samples per step (at most the model's bound)", F_INT, 1, 1 << 24, "samples", BOTH, R_(batch)},
    {"--lr", "optimizer.lr", "base learning rate", F_NUM, 0, 1e300, NULL, TRAIN, R_(optimizer_lr)},
    {"--seed", "seed", "seed of initialisation, shuffling and dropout", F_INT, 0, 1e18, "", BOTH, R_(seed)},
    {"--checkpoint-dir", "checkpoint.dir", "where checkpoints are written", F_STR, 0, 0, NULL, TRAIN, R_(checkpoint_dir)},
    {"--checkpoint-every", "checkpoint.steps", "save every N steps (0: at each epoch end)", F_INT, 0, 1e12, "steps", TRAIN, R_(checkpoint_steps)},
    {"--checkpoint-keep", "checkpoint.keep", "keep the newest K checkpoints", F_INT, 1, 1000, "checkpoints", TRAIN, R_(checkpoint_keep)},
    {"--eval-every", "eval.steps", "evaluate every N steps (0: at each epoch end)", F_INT, 0, 1e12, "steps", TRAIN, R_(eval_steps)},
    {"--eval-batches", "eval.batches", "batches per evaluation (0: all)", F_INT, 0, 1e12, "batches", BOTH, R_(eval_batches)},
    {"--log", "log", "append JSONL metrics to FILE", F_STR, 0, 0, NULL, BOTH, R_(log)},
    {"--tensorboard", "tensorboard", "write TensorBoard event files into DIR (loss, lr, grad norm, throughput, eval metrics, samples)", F_STR, 0,
     0, NULL, BOTH, O_(tensorboard)},
    {"--limit", "limit", "use only the first N training samples (quick runs)", F_INT, 1, 1e12, "samples", TRAIN, O_(limit)},
    {"--sample-tokens", "sample.tokens", "language models: tokens generated at each evaluation (0: none)", F_INT, 0, 100000, "tokens", BOTH, R_(sample_tokens)},
    {"--temperature", "sample.temperature", "sampling temperature", F_NUM, 1e-3, 100, NULL, BOTH, R_(sample_temperature)},
    {"--top-k", "sample.top_k", "sample among the k most likely tokens (0: all)", F_INT, 0, 1e9, "tokens", BOTH, R_(sample_top_k)},
    {"--prompt", "sample.prompt", "text the generated sample continues", F_STR, 0, 0, NULL, BOTH, R_(sample_prompt)},
    {"--bench-steps", "bench.steps", "time N training steps and the eval step on random inputs, print one bench: JSON line, exit", F_INT, 1,
     1e9, "timed steps", TRAIN, O_(bench_steps)},
    {"--profile", "bench.profile", "with --bench-steps: time each kernel of the training and eval steps, print a table", F_SWITCH, 0, 0,
     NULL, TRAIN, O_(bench_profile)},
    {"--print-recipe", "print.recipe", "print the recipe as the program runs it (the model's, flags applied), one value a line, exit",
     F_SWITCH, 0, 0, NULL, BOTH, O_(print_recipe)},
    {"--eval", "eval.only", "evaluate (the --resume checkpoint, or fresh weights) on the evaluation data, print and log it, exit",
     F_SWITCH, 0, 0, NULL, BOTH, O_(eval_only)},
    {"--data", NULL, "read model input INPUT from PATH, any format (or --data PATH for text/tokens)", F_STR, 0, 0, NULL, BOTH, 0},
    {"--eval-data", NULL, "evaluate on model input INPUT from PATH instead of the recipe's eval data", F_STR, 0, 0, NULL, BOTH, 0},
    {"--resume", NULL, "continue from the newest checkpoint in DIR", F_STR, 0, 0, NULL, BOTH, 0},
    {"--threads", NULL, "threads of the generated kernels (default: all cores)", F_INT, 1, 1024, "threads", BOTH, 0},
};
#define NFLAGS ((int)(sizeof flags / sizeof flags[0]))
_Static_assert(NFLAGS <= 32, "Options.given holds 32 flags");

/* Whether `flag` was given. */
static bool given(const char *flag)
{
    for (int f = 0; f < NFLAGS; f++)
        if (!strcmp(flags[f].flag, flag)) return OPT.given[f];
    return false;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: %s [options]\n\nTrains %s (generated by kiln from %s) by its recipe; options override it.\n\noptions:\n",
            M->name, M->name, M->source);
    for (int i = 0; i < NFLAGS; i++) {
        const Flag *g = &flags[i];
        char name[40];
        const char *arg = g->kind == F_SWITCH ? "" : !strcmp(g->flag, "--data") || !strcmp(g->flag, "--eval-data") ? " INPUT=PATH"
                                                     : !strcmp(g->flag, "--resume") ? " DIR"
                                                     : !strcmp(g->flag, "--log") ? " FILE"
                                                     : !strcmp(g->flag, "--prompt") ? " TEXT"
                                                     : g->kind == F_NUM ? " X" : g->kind == F_INT ? " N" : " DIR";
        snprintf(name, sizeof name, "%s%s", g->flag, arg);
        if (!g->key || !strncmp(g->key, "bench.", 6) || !strcmp(g->key, "eval.only") || !strcmp(g->key, "print.recipe") || !strcmp(g->key, "tensorboard")) /* flags only */
            fprintf(f, "  %-22s %s\n", name, g->help);
        else
            fprintf(f, "  %-22s %s (recipe: %s)\n", name, g->help, g->key);
    }
    tm_dist_usage(f); /* a distributed program's own */
    fprintf(f, "  %-22s %s\n", "--help", "show this help");
}

/* --threads beyond this many per CPU the program may use are cut to it: more only wait
 * for each other, and each takes a stack (100000 overflowed libgomp). */
#define THREADS_PER_CPU 4

/* Checks a flag's value: a number in its range, a whole one for counts, a string that is
 * not empty. Returns 0, or 2 after a message naming the flag. */
static int check_value(const Flag *g, const char *v)
{
    if (g->kind == F_STR) return *v ? 0 : (tm_die("%s: the value is empty", g->flag), 2);
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    /* Decimal only: strtod also reads hexadecimal (0x10) and "infinity". */
    bool decimal = strpbrk(v, "xXpP") == NULL && (isdigit((unsigned char)v[0]) || v[0] == '-' || v[0] == '+' || v[0] == '.' ||
                                                  !strcasecmp(v, "nan") || !strcasecmp(v, "inf"));
    if (end == v || *end || isspace((unsigned char)*v) || !decimal) return tm_die("%s: '%s' is not a number", g->flag, v), 2;
    if (g->kind == F_INT) {
        errno = 0;
        long long n = strtoll(v, &end, 10);
        bool whole = !*end && errno != ERANGE; /* else 1e5 is whole too; 2.5 and nan are not */
        if (!whole && (x != nearbyint(x) || isnan(x))) return tm_die("%s %s: give a whole number%s%s", g->flag, v, *g->unit ? " of " : "", g->unit), 2;
        if (!whole) n = x > 9e18 ? LLONG_MAX : x < -9e18 ? LLONG_MIN : (long long)x;
        if ((double)n > g->hi)
            return tm_die("%s %s: give a whole number%s%s, at most %.0f", g->flag, v, *g->unit ? " of " : "", g->unit, g->hi), 2;
        if ((double)n < g->lo) return tm_die("%s %s: give a whole number%s%s, at least %.0f", g->flag, v, *g->unit ? " of " : "", g->unit, g->lo), 2;
        return 0;
    }
    if (!(x >= g->lo && x <= g->hi)) /* NaN too */
        return g->hi >= 1e300 ? (tm_die("%s %s: give a finite number, at least %g", g->flag, v, g->lo), 2)
                              : (tm_die("%s %s: give a number from %g to %g", g->flag, v, g->lo, g->hi), 2);
    return 0;
}

/* The model input named by the first `len` bytes of s, or -1. */
static int input_named(const char *s, size_t len)
{
    for (int k = 0; k < M->ninputs; k++)
        if (strlen(M->inputs[k].name) == len && !strncmp(M->inputs[k].name, s, len)) return k;
    return -1;
}

static bool lm_data(void) { return kiln_recipe_lm_data(R); }

static void input_list(char *buf, size_t cap)
{
    size_t o = 0;
    buf[0] = 0;
    for (int k = 0; k < M->ninputs && o < cap; k++) o += (size_t)snprintf(buf + o, cap - o, "%s%s", k ? ", " : "", M->inputs[k].name);
}

/* --data / --eval-data VALUE: INPUT=PATH for a model whose recipe maps inputs to files;
 * the whole value is the path (a glob for text) for a language model's one stream. */
static int data_flag(const char *flag, const char *v)
{
    char inputs[512];
    input_list(inputs, sizeof inputs);
    const bool eval = !strcmp(flag, "--eval-data");
    if (lm_data()) {
        if (eval)
            return tm_die("--eval-data: %s evaluates on the val split of its training data (data = %s(..., val = F))", M->name,
                          kiln_recipe_call_name(R->data)),
                   2;
        OPT.r.data_path = v;
        return 0;
    }
    const char *eq = strchr(v, '=');
    if (!eq) return tm_die("%s %s: give INPUT=PATH, one for each input of the model (%s)", flag, v, inputs), 2;
    if (input_named(v, (size_t)(eq - v)) < 0) return tm_die("%s %s: the model has no input '%.*s' (its inputs: %s)", flag, v, (int)(eq - v), v, inputs), 2;
    if (!eq[1]) return tm_die("%s %s: the path is empty", flag, v), 2;
    if (set_file(eval ? &OPT.r.eval_data_files : &OPT.r.data_files, eval ? OPT.eval_files : OPT.data_files, v, (size_t)(eq - v), eq + 1))
        return tm_die("too many options"), 2;
    /* Eval files given by flag replace a val split too: the recipe then has eval_data (read
     * by the files' content, whatever the call); training files given to a model whose
     * recipe names no data are its data likewise. */
    if (eval && OPT.r.eval_data == KILN_RECIPE_CALL_NONE) OPT.r.eval_data = KILN_RECIPE_CALL_eval_data_idx;
    if (!eval && OPT.r.data == KILN_RECIPE_CALL_NONE) OPT.r.data = KILN_RECIPE_CALL_data_idx;
    return 0;
}

/* A flag's checked value into its field. */
static void set_field(const Flag *g, const char *v)
{
    char *p = (char *)&OPT + g->field;
    switch (g->kind) {
    case F_INT: *(int64_t *)(void *)p = parse_int(v); break;
    case F_NUM: *(double *)(void *)p = strtod(v, NULL); break;
    case F_STR: *(const char **)(void *)p = v; break;
    case F_SWITCH: *(bool *)p = true; break;
    }
}

/* ---- --print-recipe: every key and argument of the typed recipe, by its recipe name ----
 * Expanded from kiln_recipe.h's tables, as the checker's schema is (kiln check; test_recipe
 * compares the two): "batch = 64", "optimizer = AdamW", "optimizer.lr = 0.001" (an
 * argument's field, shared by the calls that take it, printed once), "data.x = PATH". */
static void print_quoted(const char *v)
{
    putchar('"');
    for (const char *p = v; *p; p++) {
        if (*p == '\n') fputs("\\n", stdout);
        else if (*p == '"' || *p == '\\') printf("\\%c", *p);
        else putchar(*p);
    }
    putchar('"');
}
static void print_str(const char *name, const char *v)
{
    printf("%s = ", name);
    if (v) print_quoted(v);
    else fputs("(none)", stdout);
    putchar('\n');
}
/* The shortest %g that reads back as the same double. */
static const char *num_text(double v, char *buf, size_t n)
{
    if (v == floor(v) && fabs(v) < 1e15) {
        snprintf(buf, n, "%.0f", v);
        return buf;
    }
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, n, "%.*g", p, v);
        if (strtod(buf, NULL) == v) break;
    }
    return buf;
}
static void print_files(const char *key, const kiln_recipe_files *f)
{
    for (int32_t i = 0; i < f->n; i++) printf("%s.%s = \"%s\"\n", key, f->v[i].input, f->v[i].path);
}
#define PR_INT(name, v, ch) printf("%s = %lld\n", name, (long long)(v))
#define PR_NUM(name, v, ch) printf("%s = %s\n", name, num_text((v), nb[0], sizeof nb[0]))
#define PR_BOOL(name, v, ch) printf("%s = %s\n", name, (v) ? "true" : "false")
#define PR_STR(name, v, ch) print_str(name, v)
#define PR_PAIR(name, v, ch) printf("%s = [%s, %s]\n", name, num_text((v)[0], nb[0], sizeof nb[0]), num_text((v)[1], nb[1], sizeof nb[1]))
#define PR_NAME(name, v, ch) PR_NAME_##ch(name, v)
#define PR_NAME_none(name, v) print_str(name, v)
#define PR_NAME_precision(name, v) printf("%s = %s\n", name, kiln_recipe_precision_name(v))
#define PR_NAME_weight_rounding(name, v) printf("%s = %s\n", name, kiln_recipe_weight_rounding_name(v))
#define PR_NAME_decay(name, v) printf("%s = %s\n", name, kiln_recipe_decay_name(v))
#define PR_NAME_anneal_strategy(name, v) printf("%s = %s\n", name, kiln_recipe_anneal_strategy_name(v))
#define PR_CALL(name, v, ch) printf("%s = %s\n", name, (v) == KILN_RECIPE_CALL_NONE ? "(none)" : kiln_recipe_call_name(v))
/* keys by field (f): the ones of several fields */
#define PR_KEY_INT(name, f, ch) PR_INT(name, R->f, ch)
#define PR_KEY_NUM(name, f, ch) PR_NUM(name, R->f, ch)
#define PR_KEY_STR(name, f, ch) PR_STR(name, R->f, ch)
#define PR_KEY_NAME(name, f, ch) PR_NAME(name, R->f, ch)
#define PR_KEY_CALL(name, f, ch) PR_CALL(name, R->f, ch)
#define PR_KEY_DATA(name, f, ch) (PR_CALL(name, R->f, ch), print_files(name, &R->f##_files))
#define PR_KEY_SCALE(name, f, ch)                                                                                                 \
    ((R->f) == KILN_RECIPE_LOSS_SCALE_STATIC ? printf("%s = %s\n", name, num_text(R->f##_value, nb[0], sizeof nb[0]))                                         \
                                              : printf("%s = %s\n", name, kiln_recipe_loss_scale_name(R->f)))
#define PR_KEY_GROUPS(name, f, ch) print_groups(&R->f)

static void print_groups(const kiln_recipe_groups *gs)
{
    char nb[2][32];
    printf("groups = %d\n", (int)gs->n);
    for (int32_t k = 0; k < gs->n; k++) {
        const kiln_recipe_group *g = &gs->v[k];
        printf("groups.%d.pattern = \"%s\"\n", (int)k, g->pattern);
        if (g->has_lr) printf("groups.%d.lr = %s\n", (int)k, num_text(g->lr, nb[0], sizeof nb[0]));
        if (g->has_weight_decay) printf("groups.%d.weight_decay = %s\n", (int)k, num_text(g->weight_decay, nb[0], sizeof nb[0]));
        for (int32_t i = 0; i < g->nparams; i++) printf("groups.%d.params = \"%s\"\n", (int)k, g->params[i]);
    }
}

static void print_recipe(void)
{
    char nb[2][32];
#define PR_KEY(key, kind, dflt, lo, hi, ch, completed, doc) PR_KEY_##kind(#key, key, ch);
    KILN_RECIPE_KEYS(PR_KEY)
#undef PR_KEY
    /* each argument's field once: the first call that takes it prints it */
    const char *done[128];
    int ndone = 0;
#define PR_ARG_FIELD_data(arg) R->data_##arg
#define PR_ARG_FIELD_eval_data(arg) R->eval_data_##arg
#define PR_ARG_FIELD_optimizer(arg) R->optimizer_##arg
#define PR_ARG_FIELD_schedule(arg) R->schedule_##arg
#define PR_ARG_FIELD_checkpoint(arg) R->checkpoint_##arg
#define PR_ARG_FIELD_eval(arg) R->eval_##arg
#define PR_ARG_FIELD_sample(arg) R->sample_##arg
#define PR_ARG_FIELD_groups(arg) 0 /* printed with each group */
#define PR_ARG_groups(arg, kind, ch)
#define PR_ARG_OF(key, arg, kind, ch) PR_##kind(#key "." #arg, PR_ARG_FIELD_##key(arg), ch)
#define PR_ARG(key, arg, kind, dflt, lo, hi, ch)                                                                                  \
    if (strcmp(#key, "groups")) {                                                                                                 \
        bool seen = false;                                                                                                        \
        for (int i = 0; i < ndone; i++) seen = seen || !strcmp(done[i], #key "." #arg);                                           \
        if (!seen && ndone < 128) {                                                                                               \
            done[ndone++] = #key "." #arg;                                                                                        \
            PR_ARG_##key(arg, kind, ch);                                                                                          \
        }                                                                                                                         \
    }
#define PR_ARG_data(arg, kind, ch) PR_ARG_OF(data, arg, kind, ch)
#define PR_ARG_eval_data(arg, kind, ch) PR_ARG_OF(eval_data, arg, kind, ch)
#define PR_ARG_optimizer(arg, kind, ch) PR_ARG_OF(optimizer, arg, kind, ch)
#define PR_ARG_schedule(arg, kind, ch) PR_ARG_OF(schedule, arg, kind, ch)
#define PR_ARG_checkpoint(arg, kind, ch) PR_ARG_OF(checkpoint, arg, kind, ch)
#define PR_ARG_eval(arg, kind, ch) PR_ARG_OF(eval, arg, kind, ch)
#define PR_ARG_sample(arg, kind, ch) PR_ARG_OF(sample, arg, kind, ch)
#define PR_CALL_ARGS(key, call, args, map, doc) KILN_RECIPE_ARGS_##args(PR_ARG)
    KILN_RECIPE_CALLS(PR_CALL_ARGS)
    printf("limit = %lld\n", (long long)OPT.limit); /* the flags' own */
    print_str("tensorboard", OPT.tensorboard);
}

/* Parses argv into overrides; *resume is --resume's DIR. Returns -1 to go on, else the
 * exit status (0 after --help). */
static int parse_args(int argc, char **argv, const char **resume)
{
    OPT.r = *M->recipe;
    OPT.tensorboard = "";
    bool *mode_given = OPT.given;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        int f = 0;
        while (f < NFLAGS && strcmp(a, flags[f].flag)) f++;
        if (f == NFLAGS) {
            if (a[0] != '-') return tm_die("unexpected argument '%s': every option is a --flag (see --help)", a), 2;
            const char *eq = strchr(a, '=');
            if (eq && eq > a + 2) return tm_die("unknown option '%s' (give the value after a space: %.*s %s; see --help)", a, (int)(eq - a), a, eq + 1), 2;
            return tm_die("unknown option '%s' (see --help)", a), 2;
        }
        const Flag *g = &flags[f];
        mode_given[f] = 1;
        if (g->kind == F_SWITCH) {
            set_field(g, "");
            continue;
        }
        if (i + 1 >= argc) return tm_die("%s needs a value (see --help)", a), 2;
        const char *v = argv[++i];
        int rc = check_value(g, v);
        if (rc) return rc;
        if (!strcmp(a, "--data") || !strcmp(a, "--eval-data")) rc = data_flag(a, v);
        else if (!strcmp(a, "--resume")) *resume = v;
        else if (!strcmp(a, "--threads")) { /* OpenMP's; BLAS runs inside the kernels' tasks */
            int n = atoi(v), cpus = krt_cpus(), most = cpus * THREADS_PER_CPU;
            if (n > most) {
                fprintf(stderr, "%s: note: --threads %d: %d CPU%s available, so %d threads (at most %d per CPU)\n", M->name, n, cpus,
                        cpus == 1 ? " is" : "s are", most, THREADS_PER_CPU);
                n = most;
            }
            krt_set_threads(n);
        }
        else {
            set_field(g, v);
            /* --eval-every / --checkpoint-every N replace the recipe's policy: every N steps,
             * or at each epoch end for 0 (the recipe's every(...) may also count epochs). */
            if (g->field == R_(eval_steps)) OPT.r.eval_epochs = atoll(v) > 0 ? 0 : 1;
            if (g->field == R_(checkpoint_steps)) OPT.r.checkpoint_epochs = atoll(v) > 0 ? 0 : 1;
        }
        if (rc) return rc;
    }
    bool eval_only = OPT.eval_only;
    if (eval_only && OPT.bench_steps) return tm_die("--eval and --bench-steps: give one of them"), 2;
    for (int f = 0; f < NFLAGS; f++) {
        if (!mode_given[f]) continue;
        if (eval_only && !(flags[f].modes & EVAL))
            return tm_die("%s has no effect with --eval, which only evaluates (leave it out)", flags[f].flag), 2;
    }
    if (OPT.print_recipe) {
        print_recipe();
        return 0;
    }
    if (OPT.bench_profile && !OPT.bench_steps)
        return tm_die("--profile times the steps of a benchmark: give --bench-steps N too"), 2;
    /* Sampling flags act only for language models, which print a sample at each evaluation. */
    static const char *const sample_flags[] = {"--sample-tokens", "--temperature", "--top-k", "--prompt"};
    for (int f = 0; f < NFLAGS; f++)
        for (int s = 0; s < 4; s++)
            if (mode_given[f] && !strcmp(flags[f].flag, sample_flags[s]) && !lm_data())
                return tm_die("%s: only language models (data = text(...) or tokens(...)) print samples; %s does not", flags[f].flag, M->name),
                       2;
    return -1;
}

/* ---- parameters ---- */

static void init_params(float *params, unsigned char *buffers, uint64_t seed)
{
    for (int i = 0; i < M->nparams; i++) {
        const kiln_param *p = &M->params[i];
        uint64_t key = kiln_rng_name_key(p->name);
        for (int64_t e = 0; e < p->count; e++) {
            double v = 0;
            switch (p->init) {
            case KILN_INIT_ZEROS: v = 0; break;
            case KILN_INIT_ONES: v = 1; break;
            case KILN_INIT_CONSTANT: v = p->init_a; break;
            case KILN_INIT_UNIFORM: v = p->init_a + (p->init_b - p->init_a) * kiln_rng_uniform53(seed, key, 0, (uint64_t)e); break;
            case KILN_INIT_NORMAL: v = p->init_a + p->init_b * kiln_rng_normal(seed, key, 0, (uint64_t)e); break;
            }
            if (e >= p->zero_from && e < p->zero_to) v = 0;
            if (p->trainable) params[p->offset + e] = (float)v;
            else if (p->dtype == KRT_F32) ((float *)(buffers + p->offset))[e] = (float)v;
            else if (p->dtype == KRT_I64) ((int64_t *)(buffers + p->offset))[e] = (int64_t)v;
        }
    }
}

/* ---- the device's memory and the update after each step ---- */

/* Where the steps run (kiln_model.h's kiln_device: the model's device, or the host) and
 * what the update after a step uses, all in the device's memory. The host keeps copies of
 * parameters, buffers and optimizer moments only to initialise them and for checkpoints;
 * on the host device they are the same memory. */
typedef struct {
    const kiln_device *dev;
    void *ctx;
    float *params, *grads, *acc;    /* acc: accumulated gradients (accumulate > 1) */
    unsigned char *buffers, *arena;
    krt_optim_state state;          /* its moments in the device's memory */
    krt_optim_config oc;
    krt_schedule sc;
    krt_param_span *spans;
    double *group_lr; /* per span: its parameter group's base lr (spans[k].grouped) */
    int nspans;
    int64_t accumulate;
    double clip;
    bool scaling;          /* fp16's loss scaling (the recipe's loss_scale) */
    krt_loss_scaler scaler;
    krt_tboard *tb;        /* --tensorboard's event file (rank 0), or NULL */
} Trainer;
static Trainer TR;

/* One micro-batch's gradients added to the accumulated ones. */
void tm_accumulate_grads(void)
{
    if (TR.accumulate > 1) TR.dev->accumulate(TR.ctx, TR.acc, TR.grads, M->nparam_floats, (float)TR.accumulate);
}

/* The update after a step's last micro-batch, at 0-based optimizer step `step`: clipping,
 * the schedule's learning rate (*lr), the optimizer. Returns the gradient norm before
 * clipping when clipping or asked for, else 0: without clipping the norm is only logged,
 * one more pass over the gradients (5% of mlp's step), made only when it is. */
double tm_apply_update(int64_t step, bool want_norm, double *lr)
{
    const int64_t np = M->nparam_floats;
    float *g = TR.accumulate > 1 ? TR.acc : TR.grads;
    tm_dist_reduce_grads(g, np); /* the global batch's gradient, on every rank */
    bool take = true; /* loss scaling: unscaled in the norm's pass; an inf/NaN skips the step (GradScaler) */
    double norm = TR.scaling  ? TR.dev->unscale_clip_grad_norm(TR.ctx, g, np, (float)(1.0 / (double)TR.scaler.scale), TR.clip)
                  : TR.clip > 0 ? TR.dev->clip_grad_norm(TR.ctx, g, np, TR.clip) : want_norm ? TR.dev->grad_norm(TR.ctx, g, np) : 0;
    if (TR.scaling) take = krt_scaler_update(&TR.scaler, !isfinite(norm));
    *lr = krt_schedule_lr(&TR.sc, TR.oc.lr, step);
    for (int k = 0; k < TR.nspans; k++) /* each group's rate, scheduled from its own base, as each torch param group */
        if (TR.spans[k].grouped) TR.spans[k].lr = krt_schedule_lr(&TR.sc, TR.group_lr[k], step);
    if (take) TR.dev->optim_step(TR.ctx, &TR.oc, &TR.state, *lr, TR.params, g, TR.spans, TR.nspans);
    if (TR.acc) TR.dev->zero(TR.ctx, TR.acc, (int64_t)sizeof(float) * np);
    return norm;
}

float tm_loss_scale(void) { return TR.scaling ? TR.scaler.scale : 1.0f; }

/* The recipe's parameter groups (groups.K.params: the names the compiler matched, the
 * first matching group winning; groups.K.lr, groups.K.weight_decay) onto the spans: a
 * group's lr replaces the optimizer's (--lr included) for its parameters, and its
 * weight_decay applies to them whatever their rank. Returns non-zero (after a message)
 * for a name that is no trainable parameter, which only a hand-edited model.c can give. */
static int apply_groups(const krt_optim_config *oc)
{
    for (int32_t gi = 0; gi < R->groups.n; gi++) {
        const kiln_recipe_group *grp = &R->groups.v[gi];
        const double lr = grp->has_lr ? grp->lr : oc->lr;
        for (int32_t n = 0; n < grp->nparams; n++) {
            const char *name = grp->params[n];
            int k = -1, span = 0;
            for (int i = 0; i < M->nparams && k < 0; i++) {
                if (!M->params[i].trainable) continue;
                if (!strcmp(M->params[i].name, name)) k = span;
                else span++;
            }
            if (k < 0 || k >= TR.nspans) return tm_die("parameter group %d names '%s', which is not a trainable parameter", (int)gi, name);
            TR.spans[k].grouped = true;
            TR.group_lr[k] = lr;
            TR.spans[k].weight_decay = grp->has_weight_decay ? grp->weight_decay : oc->weight_decay;
            if (grp->has_weight_decay) TR.spans[k].decay = TR.spans[k].weight_decay != 0;
        }
    }
    return 0;
}

/* The host's copies (initialised, or loaded from a checkpoint) into the device's memory,
 * and back before a checkpoint is written. */
static void state_to_device(const float *params, const unsigned char *buffers, const krt_optim_state *st)
{
    const int64_t bytes = (int64_t)sizeof(float) * M->nparam_floats;
    TR.dev->to_device(TR.ctx, TR.params, params, bytes);
    TR.dev->to_device(TR.ctx, TR.buffers, buffers, M->buffer_bytes);
    if (st->m) TR.dev->to_device(TR.ctx, TR.state.m, st->m, bytes);
    if (st->v) TR.dev->to_device(TR.ctx, TR.state.v, st->v, bytes);
    if (st->w) TR.dev->to_device(TR.ctx, TR.state.w, st->w, bytes);
    TR.state.step = st->step;
}

static void state_to_host(float *params, unsigned char *buffers, krt_optim_state *st)
{
    const int64_t bytes = (int64_t)sizeof(float) * M->nparam_floats;
    TR.dev->to_host(TR.ctx, params, TR.params, bytes);
    TR.dev->to_host(TR.ctx, buffers, TR.buffers, M->buffer_bytes);
    if (st->m) TR.dev->to_host(TR.ctx, st->m, TR.state.m, bytes);
    if (st->v) TR.dev->to_host(TR.ctx, st->v, TR.state.v, bytes);
    if (st->w) TR.dev->to_host(TR.ctx, st->w, TR.state.w, bytes);
    st->step = TR.state.step;
}

/* ---- data ---- */

typedef struct {
    krt_array *arrays; /* the training inputs, then the evaluation inputs */
    int narrays;
    krt_array stream;
    krt_dataset *train, *eval;
} Data;

int tm_batch_symbol(void)
{
    return M->ninputs && M->inputs[0].rank ? M->inputs[0].sym[0] : -1;
}

/* Checks that a loaded array has the per-sample shape of model input k. */
static int check_rows(const krt_array *a, int k, const char *path)
{
    const kiln_input *in = &M->inputs[k];
    if (a->rank != in->rank) return tm_die("%s: data for input '%s' has rank %d, the model expects rank %d", path, in->name, a->rank, in->rank);
    for (int d = 1; d < in->rank; d++)
        if (in->sym[d] < 0 && a->dims[d] != in->dims[d])
            return tm_die("%s: data for input '%s' has size %lld in dimension %d, the model expects %lld", path, in->name,
                       (long long)a->dims[d], d, (long long)in->dims[d]);
    if (in->max_value > 0) {
        int64_t n = krt_array_count(a);
        for (int64_t e = 0; e < n; e++) {
            int64_t v = a->dtype == KRT_U8 ? ((const uint8_t *)a->data)[e] : a->dtype == KRT_I32 ? ((const int32_t *)a->data)[e]
                                                                              : a->dtype == KRT_I64 ? ((const int64_t *)a->data)[e] : 0;
            if (v < 0 || v >= in->max_value)
                return tm_die("%s: value %lld at element %lld of input '%s' is out of range [0, %lld)", path, (long long)v, (long long)e,
                           in->name, (long long)in->max_value);
        }
    }
    return 0;
}

static int load_rows(const char *prefix, const kiln_recipe_files *files, krt_array *arrays, krt_error *err)
{
    for (int k = 0; k < M->ninputs; k++) {
        const char *path = file_of(files, M->inputs[k].name);
        if (!path) return tm_die("the recipe's %s has no file for input '%s' (add %s = \"...\" or --%s %s=PATH)", prefix,
                              M->inputs[k].name, M->inputs[k].name, strcmp(prefix, "data") ? "eval-data" : "data", M->inputs[k].name);
        /* The reader is chosen by the file's content, not by the recipe's idx(...) or
         * npy(...): a --data file may be of another format than the recipe's. */
        if (krt_array_load(path, &arrays[k], err) != KRT_OK) return tm_die("%s", err->msg);
        if (check_rows(&arrays[k], k, path)) return 1;
        if (k && arrays[k].dims[0] != arrays[0].dims[0])
            return tm_die("%s: %lld samples, but the data of input '%s' has %lld", path, (long long)arrays[k].dims[0], M->inputs[0].name,
                       (long long)arrays[0].dims[0]);
    }
    return 0;
}

/* The file of model input k in files, for messages. */
static const char *input_path(const kiln_recipe_files *files, int k)
{
    const char *path = file_of(files, M->inputs[k].name);
    return path ? path : "?";
}

/* A dataset's message without the runtime function's name: the caller puts the file's. */
static const char *dataset_message(const char *msg)
{
    static const char *const names[] = {"krt_dataset_rows: ", "krt_dataset_windows: "};
    for (int i = 0; i < 2; i++)
        if (!strncmp(msg, names[i], strlen(names[i]))) return msg + strlen(names[i]);
    return msg;
}

static int load_data(Data *d, int64_t *ntrain, int64_t *neval)
{
    krt_error err;
    memset(d, 0, sizeof *d);
    d->arrays = calloc(2 * (size_t)M->ninputs + 1, sizeof *d->arrays);
    if (!d->arrays) return tm_die("out of memory");
    if (R->data == KILN_RECIPE_CALL_NONE) return tm_die("the model file's train section has no `data = ...`, and no --data was given");
    double val = R->data_val;
    int64_t limit = OPT.limit;
    if (lm_data()) {
        const char *path = R->data_path;
        /* The recipe's exclude pattern filters the recipe's glob, not a path given with --data. */
        const char *exclude = given("--data") ? "" : R->data_exclude;
        /* A token stream may be any file of integers (by content, as for --data INPUT=PATH). */
        krt_status s = R->data == KILN_RECIPE_CALL_data_text ? krt_text_load(path, exclude, &d->stream, &err) : krt_array_load(path, &d->stream, &err);
        if (s != KRT_OK) return tm_die("%s", err.msg);
        if (d->stream.rank != 1 || (d->stream.dtype != KRT_U8 && d->stream.dtype != KRT_I32 && d->stream.dtype != KRT_I64))
            return tm_die("%s: tokens must be one-dimensional integers; this file holds %s of rank %d", path, krt_dtype_name(d->stream.dtype),
                       d->stream.rank);
        int64_t T = M->inputs[0].rank > 1 ? M->inputs[0].dims[1] : 1;
        int64_t n = krt_array_count(&d->stream), nval = (int64_t)((double)n * val);
        int64_t vocab = M->inputs[0].max_value > 0 ? M->inputs[0].max_value : INT32_MAX;
        for (int64_t e = 0; e < n; e++) {
            int64_t v = d->stream.dtype == KRT_U8    ? ((const uint8_t *)d->stream.data)[e]
                        : d->stream.dtype == KRT_I32 ? ((const int32_t *)d->stream.data)[e]
                                                     : ((const int64_t *)d->stream.data)[e];
            if (v < 0) return tm_die("%s: token %lld at position %lld is negative", path, (long long)v, (long long)e);
            if (v >= vocab)
                return tm_die("%s: token %lld at position %lld is not below the vocabulary size %lld", path, (long long)v, (long long)e,
                           (long long)vocab);
        }
        int64_t ntok = n - nval; /* --limit N: the first N windows */
        if (limit > 0 && limit < (ntok - 1) / T) ntok = limit * T + 1;
        d->train = krt_dataset_windows(&d->stream, T, 0, ntok, &err);
        if (!d->train) return tm_die("%s: %s", path, dataset_message(err.msg));
        d->eval = nval > T ? krt_dataset_windows(&d->stream, T, n - nval, nval, &err) : NULL;
    } else {
        if (load_rows("data", &R->data_files, d->arrays, &err)) return 1;
        d->narrays = M->ninputs;
        int64_t n = d->arrays[0].dims[0];
        const char *path = input_path(&R->data_files, 0), *epath = input_path(&R->eval_data_files, 0);
        if (n == 0) return tm_die("%s: the training data has no samples (0 rows)", path);
        if (R->eval_data != KILN_RECIPE_CALL_NONE) {
            if (load_rows("eval_data", &R->eval_data_files, d->arrays + M->ninputs, &err)) return 1;
            int64_t ne = d->arrays[M->ninputs].dims[0];
            if (ne == 0) return tm_die("%s: the evaluation data has no samples (0 rows)", epath);
            d->eval = krt_dataset_rows(d->arrays + M->ninputs, M->ninputs, 0, ne, &err); /* --limit is the training data's */
            if (!d->eval) return tm_die("%s: %s", epath, dataset_message(err.msg));
            d->train = krt_dataset_rows(d->arrays, M->ninputs, 0, limit > 0 && limit < n ? limit : n, &err);
        } else {
            int64_t nval = (int64_t)((double)n * val), nt = n - nval;
            if (nt == 0) return tm_die("%s: %lld sample%s, all taken by the val split (val = %g)", path, (long long)n, n == 1 ? "" : "s", val);
            d->train = krt_dataset_rows(d->arrays, M->ninputs, 0, limit > 0 && limit < nt ? limit : nt, &err);
            d->eval = nval ? krt_dataset_rows(d->arrays, M->ninputs, nt, nval, &err) : NULL;
            if (nval && !d->eval) return tm_die("%s: %s", path, dataset_message(err.msg));
        }
        if (!d->train) return tm_die("%s: %s", path, dataset_message(err.msg));
    }
    *ntrain = krt_dataset_size(d->train);
    *neval = d->eval ? krt_dataset_size(d->eval) : 0;
    return 0;
}

/* ---- TensorBoard event files (--tensorboard DIR; runtime/tboard.c) ---- */

/* Writes the events kept when `always` or a second after the last write: TensorBoard
 * sees a running job, and a fast model makes no system call per step. A failed write is
 * one warning; the run goes on without events. */
static void tb_flush(bool always)
{
    krt_error err;
    if (TR.tb && (always ? krt_tboard_flush(TR.tb, &err) : krt_tboard_flush_every(TR.tb, 1.0, &err)) != KRT_OK)
        fprintf(stderr, "%s: warning: %s; no more TensorBoard events are written, training goes on\n", M->name, err.msg);
}

/* A loss and the model's metrics under tags PREFIX/loss and PREFIX/METRIC (sums of `n`). */
static void tb_losses(int64_t step, const char *prefix, double loss, const double *metrics, double n)
{
    char tag[160];
    snprintf(tag, sizeof tag, "%s/loss", prefix);
    krt_tboard_scalar(TR.tb, step, tag, loss);
    for (int k = 0; k < M->nmetrics; k++) {
        snprintf(tag, sizeof tag, "%s/%s", prefix, M->metric_names[k]);
        krt_tboard_scalar(TR.tb, step, tag, metrics[k] / n);
    }
}

/* A training step's scalars, SummaryWriter's tags: what the JSONL log has, and the
 * throughput of the step (tokens per second for a language model, else samples). */
static void tb_step(int64_t step, int64_t epoch, double loss, const double *msum, double lr, double norm, float scale, double samples,
                    double seconds)
{
    tb_losses(step, "train", loss, msum, (double)TR.accumulate);
    krt_tboard_scalar(TR.tb, step, "train/lr", lr);
    if (isfinite(norm)) krt_tboard_scalar(TR.tb, step, "train/grad_norm", norm);
    krt_tboard_scalar(TR.tb, step, "train/epoch", (double)epoch);
    if (TR.scaling) krt_tboard_scalar(TR.tb, step, "train/loss_scale", scale);
    bool tokens = lm_data() && M->inputs[0].rank == 2;
    if (seconds > 0)
        krt_tboard_scalar(TR.tb, step, tokens ? "train/tokens_per_s" : "train/samples_per_s",
                          samples * (double)(tokens ? M->inputs[0].dims[1] : 1) / seconds);
}

/* ---- sampling from a language model ---- */

/* Where sampled tokens go: stdout, and for --tensorboard `text` (when not NULL, with room
 * for every token). */
typedef struct {
    int64_t V;
    char *text;
    size_t n;
} SampleOut;

/* A sampled token as the training program prints it: a byte-level model's printable
 * bytes (others as '?'), else the number. */
static void print_token(void *ctx, int64_t pick)
{
    SampleOut *o = ctx;
    char s[32];
    if (o->V <= 256) s[0] = pick == '\n' || (pick >= 32 && pick < 127) ? (char)pick : '?', s[1] = 0;
    else snprintf(s, sizeof s, " %lld", (long long)pick);
    fputs(s, stdout);
    if (o->text) o->n += (size_t)sprintf(o->text + o->n, "%s", s);
}

/* Continues `prompt` by n tokens, each drawn by kiln_sample_token (the logits of the last
 * position divided by the temperature, the top k kept) with the counter-based generator
 * keyed by (seed, step): through the decode step and its key/value cache when the model
 * has one (runtime/generate.c, as the inference program's --generate), else the eval step
 * on the last (at most T) tokens for each. Byte-level models print text. */
static int sample_text(kiln_step_io *io, void **bufs, float *logits, int64_t batch, uint64_t seed, int64_t step)
{
    const kiln_input *in = &M->inputs[0];
    int64_t Tmax = in->dims[1], V = 0;
    const char *prompt = R->sample_prompt;
    int64_t n = R->sample_tokens;
    double temperature = R->sample_temperature;
    int64_t top_k = R->sample_top_k;
    int bs = tm_batch_symbol(), ts = in->sym[1];
    if (n <= 0 || ts < 0 || M->noutputs < 1 || M->output_dtypes[0] != KRT_F32) return 0;
    V = in->max_value > 0 ? in->max_value : 256;
    int64_t len = (int64_t)strlen(prompt), cap = len + n;
    int32_t *tokens = malloc(sizeof(int32_t) * (size_t)(cap + 1));
    float *row = malloc(sizeof(float) * (size_t)(2 * V));
    if (!tokens || !row) {
        free(tokens);
        free(row);
        return tm_die("out of memory");
    }
    int failed = 0;
    for (int64_t i = 0; i < len; i++) tokens[i] = (unsigned char)prompt[i];
    printf("sample at step %lld: %s", (long long)step, prompt);
    SampleOut out = {.V = V, .text = TR.tb ? malloc((size_t)(len + 24 * n + 1)) : NULL};
    if (out.text) out.n = (size_t)sprintf(out.text, "%s", prompt);
    if (M->decode_step && len <= Tmax) {
        kiln_generate_config c = {.prompt = tokens, .nprompt = len, .tokens = n, .vocab = V, .temperature = temperature,
                                  .top_p = 1, .top_k = top_k, .seed = seed, .step = (uint64_t)step,
                                  .device = M->device, .device_ctx = io->device};
        krt_error err;
        if (kiln_generate(M, io->params, io->buffers, &c, print_token, &out, &err) != KRT_OK) failed = tm_die("sampling after step %lld: %s", (long long)step, err.msg);
        n = 0;
    }
    void *saved_out = io->outputs[0];
    io->outputs[0] = logits;
    for (int64_t t = 0; t < n; t++) {
        int64_t ctx = len < Tmax ? len : Tmax, first = len - ctx;
        int32_t *x = bufs[0];
        for (int64_t i = 0; i < ctx; i++) x[i] = tokens[first + i];
        if (M->ninputs > 1) memset(bufs[1], 0, (size_t)ctx * krt_dtype_size(M->inputs[1].dtype));
        if (bs >= 0) io->syms[bs] = 1;
        io->syms[ts] = ctx;
        M->eval_step(io);
        if (tm_index_failed(io, "sampling after step", step)) {
            failed = 1;
            break;
        }
        int64_t pick = kiln_sample_token(logits + (ctx - 1) * V, V, temperature, top_k, 1, kiln_sample_uniform(seed, (uint64_t)step, (uint64_t)t), row);
        tokens[len++] = (int32_t)pick;
        print_token(&out, pick);
    }
    printf("\n");
    fflush(stdout);
    if (out.text) krt_tboard_code(TR.tb, step, "samples/text", out.text); /* shown as printed */
    free(out.text);
    io->outputs[0] = saved_out;
    if (bs >= 0) io->syms[bs] = batch;
    io->syms[ts] = Tmax;
    free(tokens);
    free(row);
    return failed;
}

/* ---- evaluation ---- */

/* The loss and metrics over at most max_batches batches (0: all), and the samples they
 * covered. */
static int evaluate(krt_dataset *ds, kiln_step_io *io, void **bufs, const krt_dtype *dtypes, int64_t batch, int64_t max_batches,
                    int64_t step, double *loss, double *metrics, int64_t *samples)
{
    krt_error err;
    krt_cursor cur = {0, 0, 0};
    double total = 0, sum_loss = 0, *sum_m = calloc((size_t)M->nmetrics + 1, sizeof *sum_m);
    if (!sum_m) return tm_die("out of memory");
    int bs = tm_batch_symbol();
    for (int64_t b = 0; max_batches <= 0 || b < max_batches; b++) {
        int64_t got = 0;
        if (krt_dataset_next(ds, &cur, batch, false, false, bufs, dtypes, &got, &err) != KRT_OK) {
            free(sum_m);
            return tm_die("%s", err.msg);
        }
        if (got <= 0) break;
        if (bs >= 0) io->syms[bs] = got;
        M->eval_step(io);
        if (tm_index_failed(io, "evaluation after step", step)) {
            free(sum_m);
            return 1;
        }
        sum_loss += io->loss * (double)got;
        for (int k = 0; k < M->nmetrics; k++) sum_m[k] += io->metrics[k] * (double)got;
        total += (double)got;
        if (cur.epoch > 0) break; /* one pass */
    }
    if (bs >= 0) io->syms[bs] = batch;
    *samples = (int64_t)total;
    *loss = total > 0 ? sum_loss / total : NAN;
    for (int k = 0; k < M->nmetrics; k++) metrics[k] = total > 0 ? sum_m[k] / total : NAN;
    free(sum_m);
    return 0;
}

static bool due(int64_t step, int64_t steps, int64_t epochs, bool epoch_ended, int64_t epochs_done)
{
    return (steps > 0 && step % steps == 0) || (epochs > 0 && epoch_ended && epochs_done % epochs == 0);
}

/* Prints and logs one evaluation at `step`, and a language model's sample. */
static int eval_and_report(krt_dataset *ds, kiln_step_io *io, void **bufs, const krt_dtype *dtypes, int64_t batch, int64_t ev_batches,
                           FILE *log, float *sample_logits, uint64_t seed, int64_t step, bool tty)
{
    double el = 0, *em = calloc((size_t)M->nmetrics + 1, sizeof *em);
    int64_t samples = 0;
    if (!em) return tm_die("out of memory");
    if (evaluate(ds, io, bufs, dtypes, batch, ev_batches, step, &el, em, &samples)) {
        free(em);
        return 1;
    }
    if (tty) fputc('\n', stderr);
    /* how much of the evaluation data this was: eval.batches may cut it short */
    printf("eval at step %lld (%lld sample%s): loss %.4f", (long long)step, (long long)samples, samples == 1 ? "" : "s", el);
    for (int k = 0; k < M->nmetrics; k++) printf("  %s %.4f", M->metric_names[k], em[k]);
    putchar('\n');
    fflush(stdout);
    if (log) {
        fprintf(log, "{\"step\": %lld, \"eval_loss\": %.6g", (long long)step, el);
        for (int k = 0; k < M->nmetrics; k++) fprintf(log, ", \"eval_%s\": %.6g", M->metric_names[k], em[k]);
        fprintf(log, ", \"samples\": %lld}\n", (long long)samples); /* the metrics are eval_NAME: no clash */
        fflush(log);
    }
    if (TR.tb) tb_losses(step, "eval", el, em, 1);
    free(em);
    return sample_logits && sample_text(io, bufs, sample_logits, batch, seed, step);
}

/* One run of the training program, from its flags to its last step: what train()'s phases
 * hand on to each other. Every resource in it is released by train_free, on success and on
 * every error alike. */
typedef struct {
    const char *resume;      /* --resume DIR, or NULL */
    int64_t bench_steps; /* --bench-steps N: random inputs, no data (0: none) */
    bool eval_only, tty;
    Data data;
    /* Host copies of the parameters and buffers (the device's own on the host). */
    float *params;
    unsigned char *buffers;
    /* Sized from the model: any number of inputs, metrics, outputs and sizes. */
    void **bufs, **my_bufs; /* the global batch's inputs; this rank's share of them */
    krt_dtype *dtypes;
    int64_t *io_syms;
    double *io_metrics, *msum;
    void **io_outputs;
    krt_optim_state st;
    krt_optim_config oc; /* as the recipe and flags give it (TR.oc is the one the run updates) */
    const char *opt;     /* the optimizer's name, for the banner */
    FILE *log;
    float *sample_logits; /* language models: one row's logits for the sample */
    int64_t batch;
    int bs; /* the batch symbol, or -1 */
    uint64_t seed;
    const char *ckdir;
    int64_t keep, ck_steps, ck_epochs, ev_steps, ev_epochs, ev_batches;
    bool earlier; /* ckdir holds a checkpoint of an earlier run, named in earlier_found */
    char earlier_found[4096];
    int64_t ntrain, neval, accumulate, total_steps;
    int64_t np; /* parameter floats */
    tm_run run;
    krt_cursor cur;
    int64_t step;
    kiln_step_io io;
    int64_t share_first, share; /* this rank's samples of each global batch */
    int64_t saved;              /* the step of the last checkpoint this run saved */
} Train;

/* A phase's result that is not an exit status: the run goes on to the next phase. */
#define TRAIN_GO (-1)

static int train(int argc, char **argv);

int kiln_train_main(const kiln_model *m, int argc, char **argv)
{
    if (M) return tm_die("a process trains one model: kiln_train_main was called twice");
    M = m;
    int rc = tm_dist_init(&argc, argv); /* the processes (dist.h): MPI's in a distributed program */
    return tm_dist_finish(rc >= 0 ? rc : train(argc, argv));
}

#ifndef KILN_TRAIN_NO_MAIN
/* A built program's main: its own model. (The kiln command compiles this file without it,
 * -DKILN_TRAIN_NO_MAIN, and calls kiln_train_main with the model it compiled: kiln train's
 * JIT, cli/jit_train.c.) */
extern const kiln_model kiln_model_def;

int main(int argc, char **argv)
{
    krt_fast_environment(argc, argv); /* BLAS kernels, OpenMP wait policy, threads, FTZ (env.c) */
    return kiln_train_main(&kiln_model_def, argc, argv);
}
#endif

/* The device, the run's numbers from the recipe, the checkpoint directory and the data. */
static int train_setup(Train *T)
{
    T->bufs = calloc((size_t)M->ninputs + 1, sizeof *T->bufs);
    T->my_bufs = calloc((size_t)M->ninputs + 1, sizeof *T->my_bufs);
    T->dtypes = calloc((size_t)M->ninputs + 1, sizeof *T->dtypes);
    T->io_syms = calloc((size_t)M->nsyms + 1, sizeof *T->io_syms);
    T->io_metrics = calloc((size_t)M->nmetrics + 1, sizeof *T->io_metrics);
    T->msum = calloc((size_t)M->nmetrics + 1, sizeof *T->msum);
    T->io_outputs = calloc((size_t)M->noutputs + 1, sizeof *T->io_outputs);
    if (!T->bufs || !T->my_bufs || !T->dtypes || !T->io_syms || !T->io_metrics || !T->msum || !T->io_outputs) return tm_die("out of memory");
    /* The device first: a program built for a GPU on a machine without one says so at once. */
    char derr[1024] = "";
    TR.ctx = TR.dev->open(M, derr, sizeof derr);
    if (!TR.ctx) return tm_die("%s", derr);
    T->batch = R->batch;
    T->bs = tm_batch_symbol();
    int64_t bmax = T->bs >= 0 ? M->syms[T->bs].max : T->batch;
    if (T->batch < 1 || T->batch > bmax) {
        tm_die("--batch %lld: the model was built for batches of at most %lld", (long long)T->batch, (long long)bmax);
        return 2;
    }
    T->seed = (uint64_t)R->seed;
    T->ckdir = R->checkpoint_dir;
    T->keep = R->checkpoint_keep;
    T->ck_steps = R->checkpoint_steps, T->ck_epochs = R->checkpoint_epochs;
    T->ev_steps = R->eval_steps, T->ev_epochs = R->eval_epochs;
    T->ev_batches = R->eval_batches;
    if (T->keep < 1) {
        tm_die("checkpoint keep = %lld: keep at least 1 checkpoint", (long long)T->keep);
        return 2;
    }
    T->bench_steps = OPT.bench_steps;
    krt_error err;
    if (!T->bench_steps && !T->eval_only && tm_dist_rank() == 0) { /* rank 0 alone writes checkpoints */
        /* Before anything long: a run must not train for hours and then find that it
         * cannot save. A run that starts afresh where checkpoints are says so. */
        if (krt_ckpt_prepare(T->ckdir, &err) != KRT_OK) return tm_die("%s", err.msg);
        int64_t at;
        T->earlier = !T->resume && krt_ckpt_find(T->ckdir, T->earlier_found, sizeof T->earlier_found, &at, NULL, &err) == KRT_OK;
    }
    if (T->bench_steps) T->ntrain = T->batch;
    else if (load_data(&T->data, &T->ntrain, &T->neval))
        return 1;
    if (!T->bench_steps && !T->data.eval) {
        const char *why = T->eval_only ? "--eval" : given("--eval-every") ? "--eval-every" : given("--eval-batches") ? "--eval-batches" : NULL;
        if (why)
            return tm_die("%s: there is no evaluation data (the recipe has no eval_data and no val split%s)", why,
                          lm_data() ? "" : "; give --eval-data INPUT=PATH");
    }
    if (!T->eval_only && T->ntrain < T->batch)
        return tm_die("the training data has %lld sample%s, fewer than one batch of %lld", (long long)T->ntrain, T->ntrain == 1 ? "" : "s",
                      (long long)T->batch);
    int64_t steps_per_epoch = T->ntrain / T->batch;
    T->accumulate = R->accumulate;
    if (T->accumulate < 1) T->accumulate = 1;
    T->total_steps = R->steps;
    if (T->total_steps <= 0) T->total_steps = R->epochs * steps_per_epoch / T->accumulate;
    if (!T->eval_only && !T->bench_steps && T->total_steps < 1)
        return tm_die("an epoch of %lld batch%s of %lld sample%s is shorter than one step of %lld accumulated batches: give --steps N",
                      (long long)steps_per_epoch, steps_per_epoch == 1 ? "" : "es", (long long)T->batch, T->batch == 1 ? "" : "s",
                      (long long)T->accumulate);
    return TRAIN_GO;
}

/* The optimizer, the schedule, clipping and loss scaling, from the recipe. */
static int train_optimizer(Train *T)
{
    krt_optim_config oc;
    memset(&oc, 0, sizeof oc);
    TR.accumulate = T->accumulate;
    const int32_t opt = R->optimizer;
    oc.kind = opt == KILN_RECIPE_CALL_optimizer_SGD       ? KRT_SGD
              : opt == KILN_RECIPE_CALL_optimizer_Adam    ? KRT_ADAM
              : opt == KILN_RECIPE_CALL_optimizer_RMSprop ? KRT_RMSPROP
              : opt == KILN_RECIPE_CALL_optimizer_Adagrad ? KRT_ADAGRAD
              : opt == KILN_RECIPE_CALL_optimizer_Lion    ? KRT_LION
                                                          : KRT_ADAMW;
    oc.lr = R->optimizer_lr;
    oc.momentum = R->optimizer_momentum;
    oc.dampening = R->optimizer_dampening;
    oc.nesterov = R->optimizer_nesterov;
    oc.beta1 = R->optimizer_betas[0];
    oc.beta2 = R->optimizer_betas[1];
    oc.eps = R->optimizer_eps;
    oc.amsgrad = R->optimizer_amsgrad;
    oc.alpha = R->optimizer_alpha;
    oc.centered = R->optimizer_centered;
    oc.lr_decay = R->optimizer_lr_decay;
    oc.initial_accumulator_value = R->optimizer_initial_accumulator_value;
    oc.weight_decay = R->optimizer_weight_decay;
    krt_schedule sc;
    memset(&sc, 0, sizeof sc);
    const int32_t sk = R->schedule;
    sc.kind = sk == KILN_RECIPE_CALL_schedule_step              ? KRT_SCHED_STEP
              : sk == KILN_RECIPE_CALL_schedule_linear          ? KRT_SCHED_LINEAR
              : sk == KILN_RECIPE_CALL_schedule_cosine          ? KRT_SCHED_COSINE
              : sk == KILN_RECIPE_CALL_schedule_onecycle        ? KRT_SCHED_ONECYCLE
              : sk == KILN_RECIPE_CALL_schedule_exponential     ? KRT_SCHED_EXPONENTIAL
              : sk == KILN_RECIPE_CALL_schedule_polynomial      ? KRT_SCHED_POLYNOMIAL
              : sk == KILN_RECIPE_CALL_schedule_cosine_restarts ? KRT_SCHED_COSINE_RESTARTS
                                                                : KRT_SCHED_CONSTANT;
    sc.warmup = R->schedule_warmup;
    sc.step_size = R->schedule_step_size;
    sc.gamma = R->schedule_gamma;
    sc.min_lr = sc.kind == KRT_SCHED_COSINE_RESTARTS ? R->schedule_eta_min : R->schedule_min_lr;
    sc.pct_start = R->schedule_pct_start;
    sc.anneal_linear = R->schedule_anneal_strategy == KILN_RECIPE_anneal_strategy_linear;
    sc.div_factor = R->schedule_div_factor;
    sc.final_div_factor = R->schedule_final_div_factor;
    sc.three_phase = R->schedule_three_phase;
    /* onecycle(max_lr): the peak of every parameter (PyTorch's OneCycleLR sets each group's
     * rate from it); --lr, given, sets the peak instead */
    sc.max_lr = given("--lr") ? 0 : R->schedule_max_lr;
    sc.power = R->schedule_power;
    sc.total_iters = R->schedule_total_iters;
    sc.t0 = R->schedule_T_0;
    sc.t_mult = R->schedule_T_mult;
    sc.total_steps = T->total_steps;
    double clip = R->clip;
    TR.oc = oc;
    TR.sc = sc;
    TR.clip = clip;
    T->oc = oc;
    T->opt = kiln_recipe_call_name(opt);
    krt_error err;
    /* none unless the model's step scales its fp16 loss (kiln build sets it; docs/precision.md) */
    char scaling[40] = "dynamic";
    if (R->loss_scale == KILN_RECIPE_LOSS_SCALE_STATIC) snprintf(scaling, sizeof scaling, "%.17g", R->loss_scale_value);
    if ((TR.scaling = R->loss_scale != KILN_RECIPE_loss_scale_none) &&
        krt_scaler_init(&TR.scaler, scaling, R->loss_scale_init, R->loss_scale_growth_interval, &err) != KRT_OK)
        return tm_die("%s", err.msg);
    T->run = (tm_run){.oc = &TR.oc, .scaler = TR.scaling ? &TR.scaler : NULL}; /* what its checkpoints carry */
    return TRAIN_GO;
}

/* Memory: every buffer allocated once, here, in the device's memory when there is one (the
 * step allocates nothing); the parameter groups; the initial weights. */
static int train_allocate(Train *T)
{
    krt_error err;
    char derr[1024] = "";
    const int64_t np = T->np = M->nparam_floats, accumulate = T->accumulate;
    krt_optim_state *st = &T->st;
    if (krt_optim_init(st, &T->oc, np, &err) != KRT_OK) return tm_die("%s", err.msg);
    int64_t arena_bytes = M->train_arena_bytes > M->eval_arena_bytes ? M->train_arena_bytes : M->eval_arena_bytes;
    const int64_t slab = (int64_t)sizeof(float) * np;
    const int64_t planned = slab * (2 + (accumulate > 1) + (st->m != NULL) + (st->v != NULL) + (st->w != NULL)) + M->buffer_bytes + arena_bytes;
    if (TR.dev->reserve(TR.ctx, planned, derr, sizeof derr)) return tm_die("%s", derr);
    TR.params = TR.dev->alloc(TR.ctx, slab);
    TR.grads = TR.dev->alloc(TR.ctx, slab);
    TR.acc = accumulate > 1 ? TR.dev->alloc(TR.ctx, slab) : NULL;
    TR.buffers = TR.dev->alloc(TR.ctx, M->buffer_bytes + 8);
    TR.arena = TR.dev->alloc(TR.ctx, arena_bytes);
    TR.state = *st;
    TR.state.m = st->m && !TR.dev->host ? TR.dev->alloc(TR.ctx, slab) : st->m;
    TR.state.v = st->v && !TR.dev->host ? TR.dev->alloc(TR.ctx, slab) : st->v;
    TR.state.w = st->w && !TR.dev->host ? TR.dev->alloc(TR.ctx, slab) : st->w;
    if (!TR.params || !TR.grads || (accumulate > 1 && !TR.acc) || !TR.buffers || !TR.arena || (st->m && !TR.state.m) ||
        (st->v && !TR.state.v) || (st->w && !TR.state.w))
        return tm_die("out of %s memory for %lld bytes of parameters, gradients, optimizer state and activations",
                      TR.dev->host ? "host" : "device", (long long)planned);
    T->params = TR.dev->host ? TR.params : calloc((size_t)np + 1, sizeof(float));
    T->buffers = TR.dev->host ? TR.buffers : calloc((size_t)M->buffer_bytes + 8, 1);
    bool decay_all = R->optimizer_decay == KILN_RECIPE_decay_all;
    TR.spans = calloc((size_t)M->nparams + 1, sizeof *TR.spans);
    for (int i = 0; TR.spans && i < M->nparams; i++)
        if (M->params[i].trainable)
            TR.spans[TR.nspans++] = (krt_param_span){.offset = M->params[i].offset, .count = M->params[i].count, .decay = decay_all || M->params[i].decay};
    TR.group_lr = calloc((size_t)M->nparams + 1, sizeof *TR.group_lr);
    if (TR.spans && TR.group_lr && apply_groups(&T->oc)) return 2;
    bool bufs_ok = true;
    for (int k = 0; k < M->ninputs; k++) {
        int64_t per = 1;
        for (int d = 1; d < M->inputs[k].rank; d++) per *= M->inputs[k].dims[d];
        T->bufs[k] = calloc((size_t)(per * T->batch) + 1, krt_dtype_size(M->inputs[k].dtype));
        bufs_ok = bufs_ok && T->bufs[k];
        T->dtypes[k] = M->inputs[k].dtype;
    }
    /* Language models print a generated sample at each evaluation: logits of one row. */
    bool lm = lm_data() && M->noutputs > 0 && M->inputs[0].rank == 2;
    int64_t vocab = M->inputs[0].max_value > 0 ? M->inputs[0].max_value : 256;
    T->sample_logits = lm ? malloc(sizeof(float) * (size_t)(M->inputs[0].dims[1] * vocab)) : NULL;
    if (lm && R->sample_tokens > 0) {
        /* The prompt's bytes are its tokens: each must be one the model knows. */
        const char *prompt = R->sample_prompt;
        if (!*prompt) return tm_die("the sample prompt is empty: give --prompt TEXT (the sample continues it)");
        for (const unsigned char *p = (const unsigned char *)prompt; *p; p++)
            if (*p >= vocab) return tm_die("--prompt: byte %d of the prompt is not below the vocabulary size %lld", *p, (long long)vocab);
    }
    T->cur = (krt_cursor){T->seed, 0, 0};
    T->step = 0;
    if (!T->params || !T->buffers || !TR.spans || !TR.group_lr || !bufs_ok || (lm && !T->sample_logits)) return tm_die("out of memory");
    init_params(T->params, T->buffers, T->seed);
    return TRAIN_GO;
}

/* The state to start from: --resume's checkpoint, then rank 0's on every rank, on the
 * device. */
static int train_resume(Train *T)
{
    krt_optim_state *st = &T->st;
    krt_cursor *cur = &T->cur;
    if (T->resume && tm_dist_rank() == 0 && tm_ckpt_load(&T->run, T->resume, T->accumulate, T->params, T->buffers, st, cur, &T->step))
        return 1;
    if (tm_dist_size() > 1) { /* every rank starts from rank 0's state, checkpoint or not */
        uint32_t bits;
        memcpy(&bits, &TR.scaler.scale, sizeof bits);
        int64_t counters[9] = {T->step, cur->epoch, cur->position, (int64_t)cur->seed, T->run.batches_drawn, st->step, bits, TR.scaler.growth_tracker,
                               TR.scaler.skipped};
        float *const slabs[3] = {st->m, st->v, st->w};
        tm_dist_share_state(T->params, T->np, T->buffers, M->buffer_bytes, slabs, 3, counters, 9);
        T->step = counters[0], cur->epoch = counters[1], cur->position = counters[2], cur->seed = (uint64_t)counters[3];
        T->run.batches_drawn = counters[4], st->step = counters[5], bits = (uint32_t)counters[6];
        memcpy(&TR.scaler.scale, &bits, sizeof bits);
        TR.scaler.growth_tracker = counters[7], TR.scaler.skipped = counters[8];
    }
    state_to_device(T->params, T->buffers, st);
    if (T->resume && given("--seed") && T->seed != cur->seed)
        return tm_die("--seed %llu: the run in %s has seed %llu, which a resumed run keeps (leave --seed out)", (unsigned long long)T->seed,
                      T->resume, (unsigned long long)cur->seed);
    T->seed = cur->seed; /* resumed: the checkpoint's, for dropout and sampling as for shuffling */
    if (T->resume && !T->eval_only && !T->bench_steps && cur->position > T->ntrain)
        return tm_die("--resume %s: the checkpoint stands at sample %lld of an epoch, but the training data has %lld samples (it was made "
                      "with other data or another --limit)",
                      T->resume, (long long)cur->position, (long long)T->ntrain);
    return TRAIN_GO;
}

/* The step's inputs and outputs, and this rank's share of each batch; then --bench-steps,
 * a run already complete, the log and TensorBoard files, and --eval end here. */
static int train_prepare(Train *T)
{
    kiln_step_io *io = &T->io;
    memset(io, 0, sizeof *io);
    io->params = TR.params;
    io->grads = TR.grads;
    io->buffers = TR.buffers;
    io->arena = TR.arena;
    io->device = TR.dev->host ? NULL : TR.ctx;
    io->inputs = (const void *const *)T->bufs;
    io->seed = T->seed;
    io->syms = T->io_syms;
    io->metrics = T->io_metrics;
    io->outputs = T->io_outputs;
    for (int s = 0; s < M->nsyms; s++) io->syms[s] = M->syms[s].max;
    if (T->bs >= 0) io->syms[T->bs] = T->batch;
    /* This rank's share of each global batch: its samples of bufs (rows are contiguous). */
    tm_dist_share(T->batch, &T->share_first, &T->share);
    for (int k = 0; k < M->ninputs; k++) {
        int64_t row = (int64_t)krt_dtype_size(M->inputs[k].dtype);
        for (int d = 1; d < M->inputs[k].rank; d++) row *= M->inputs[k].dims[d];
        T->my_bufs[k] = (char *)T->bufs[k] + T->share_first * row;
    }
    tm_dist_attach(io, T->batch, T->accumulate);
    if (T->bench_steps) { /* each rank times its share */
        if (T->bs >= 0) io->syms[T->bs] = T->share;
        return tm_bench(io, T->share, T->bench_steps, TR.accumulate);
    }
    if (!T->eval_only && T->step >= T->total_steps) { /* resumed at or past the end: nothing to train */
        printf("%s: the run in %s is already complete (step %lld of %lld); --eval evaluates it, --steps N beyond %lld trains it further\n",
               M->name, T->resume, (long long)T->step, (long long)T->total_steps, (long long)T->step);
        return 0;
    }
    const char *logpath = tm_dist_rank() == 0 && R->log ? R->log : ""; /* rank 0 alone logs */
    T->log = *logpath ? fopen(logpath, "a") : NULL;
    if (*logpath && !T->log) return tm_die("%s: cannot open the log file: %s", logpath, strerror(errno));
    krt_error err;
    const char *tbdir = tm_dist_rank() == 0 ? OPT.tensorboard : ""; /* rank 0 alone, as the log */
    if (*tbdir && krt_tboard_open(tbdir, &TR.tb, &err) != KRT_OK) return tm_die("--tensorboard: %s", err.msg);
    /* A resumed run redoes the steps after its checkpoint: TensorBoard drops those of the
     * earlier files (SummaryWriter's purge_step). */
    if (T->resume && !T->eval_only) krt_tboard_restart(TR.tb, T->step + 1);
    if (T->eval_only) /* all of the evaluation data: the recipe's eval.batches is for evaluations during training */
        return eval_and_report(T->data.eval, io, T->bufs, T->dtypes, T->batch, given("--eval-batches") ? T->ev_batches : 0, T->log,
                               T->sample_logits, T->seed, T->step, false);
    return TRAIN_GO;
}

/* One optimizer step: its accumulated micro-batches, the update, the progress line and the
 * log; 0, or the exit status of a failed step. */
static int train_step(Train *T, double t0, double *t_tb)
{
    kiln_step_io *io = &T->io;
    krt_cursor *cur = &T->cur;
    const int64_t batch = T->batch, accumulate = T->accumulate, step0 = T->step;
    double loss_sum = 0;
    memset(T->msum, 0, sizeof *T->msum * (size_t)M->nmetrics);
    const int64_t epoch_before = cur->epoch;
    int64_t batch_epoch = cur->epoch; /* the (0-based) epoch of the step's last batch */
    krt_error err;
    for (int64_t micro = 0; micro < accumulate; micro++) {
        int64_t got = 0;
        if (krt_dataset_next(T->data.train, cur, batch, true, true, T->bufs, T->dtypes, &got, &err) != KRT_OK) return tm_die("%s", err.msg);
        /* After an epoch's last batch the cursor already reads (next epoch, 0). */
        batch_epoch = cur->position == 0 ? cur->epoch - 1 : cur->epoch;
        io->step = (uint64_t)(step0 * accumulate + micro);
        T->run.batches_drawn++;
        io->inputs = (const void *const *)T->my_bufs; /* this rank's share */
        if (T->bs >= 0) io->syms[T->bs] = T->share;
        io->loss_scale = tm_loss_scale();
        M->train_step(io);
        io->inputs = (const void *const *)T->bufs;
        if (T->bs >= 0) io->syms[T->bs] = batch;
        if (tm_index_failed(io, "step", step0 + 1)) return 1;
        tm_dist_global_metrics(io, step0); /* the global batch's loss and metrics */
        if (!isfinite(io->loss))
            return tm_die("the loss is %g at step %lld: training diverged (lower the learning rate, or clip gradients)", io->loss,
                          (long long)step0 + 1);
        loss_sum += io->loss;
        for (int k = 0; k < M->nmetrics; k++) T->msum[k] += io->metrics[k];
        tm_accumulate_grads();
    }
    double lr;
    const float scale = tm_loss_scale();
    double norm = tm_apply_update(step0, T->log != NULL || TR.tb != NULL, &lr);
    const int64_t step = ++T->step;
    char scaled[80] = ""; /* loss scaling: the step's scale and the steps skipped so far */
    if (TR.scaling) snprintf(scaled, sizeof scaled, "  scale %g  skipped %lld", (double)scale, (long long)TR.scaler.skipped);
    double loss = loss_sum / (double)accumulate, t = kiln_now();
    if (T->tty || step % 50 == 0 || step == T->total_steps) {
        double rate = (double)(step * batch * accumulate) / (t - t0);
        double eta = (double)(T->total_steps - step) * (t - t0) / (double)step;
        fprintf(T->tty ? stderr : stdout, "%sstep %lld/%lld  epoch %lld  loss %.4f  lr %.3g%s  %.0f samples/s  eta %.0fs%s",
                T->tty ? "\r" : "", (long long)step, (long long)T->total_steps, (long long)batch_epoch + 1, loss, lr, scaled, rate, eta,
                T->tty ? "   " : "\n");
    }
    if (T->log) {
        char nb[32] = "null"; /* an infinite or NaN norm (a skipped step): JSON has no inf */
        if (isfinite(norm)) snprintf(nb, sizeof nb, "%.6g", norm);
        fprintf(T->log, "{\"step\": %lld, \"epoch\": %lld, \"loss\": %.6g, \"lr\": %.6g, \"grad_norm\": %s", (long long)step,
                (long long)batch_epoch + 1, loss, lr, nb);
        if (TR.scaling)
            fprintf(T->log, ", \"loss_scale\": %.9g, \"skipped\": %s, \"skipped_steps\": %lld", (double)scale, isfinite(norm) ? "false" : "true",
                    (long long)TR.scaler.skipped);
        for (int k = 0; k < M->nmetrics; k++) fprintf(T->log, ", \"%s\": %.6g", M->metric_names[k], T->msum[k] / (double)accumulate);
        fputs("}\n", T->log);
    }
    if (TR.tb) tb_step(step, batch_epoch + 1, loss, T->msum, lr, norm, scale, (double)(batch * accumulate), t - *t_tb);
    bool epoch_end = cur->epoch > epoch_before; /* cur.epoch epochs are complete */
    if (T->data.eval && (due(step, T->ev_steps, T->ev_epochs, epoch_end, cur->epoch) || step == T->total_steps) &&
        eval_and_report(T->data.eval, io, T->bufs, T->dtypes, batch, T->ev_batches, T->log, T->sample_logits, T->seed, step, T->tty))
        return 1;
    if ((due(step, T->ck_steps, T->ck_epochs, epoch_end, cur->epoch) || step == T->total_steps) && tm_dist_rank() == 0) {
        state_to_host(T->params, T->buffers, &T->st);
        if (tm_ckpt_save(&T->run, T->ckdir, T->keep, T->params, T->buffers, &T->st, cur, step)) return 1;
        T->saved = step;
    }
    if (TR.tb) {
        tb_flush(false);
        *t_tb = kiln_now(); /* the evaluation and checkpoint are no step's time */
    }
    return 0;
}

/* The steps, from the banner to the last one or to ^C, which saves a checkpoint first. */
static int train_loop(Train *T)
{
    if (T->earlier && tm_dist_rank() == 0)
        fprintf(stderr, "%s: note: %s holds a checkpoint of an earlier run (%s); this run starts afresh and replaces it (--resume %s continues it)\n",
                M->name, T->ckdir, T->earlier_found, T->ckdir);
    tm_ckpt_new_run(&T->run);
    signal(SIGINT, on_sigint);
    const char *split = tm_dist_describe(T->batch); /* "2 ranks × batch 64" */
    char scaling_is[96] = "";
    if (TR.scaling) krt_scaler_describe(&TR.scaler, scaling_is + 2, sizeof scaling_is - 2), scaling_is[0] = ',', scaling_is[1] = ' ';
    printf("%s: %lld parameters, %lld training sample%s, %lld step%s of %lld%s%s%s (x%lld), %s lr %g%s\n", M->name, (long long)T->np,
           (long long)T->ntrain, T->ntrain == 1 ? "" : "s", (long long)T->total_steps, T->total_steps == 1 ? "" : "s", (long long)T->batch,
           *split ? " (" : "", split, *split ? ")" : "", (long long)T->accumulate, T->opt, T->oc.lr, scaling_is);
    double t0 = kiln_now(), t_tb = t0; /* t_tb: the end of the previous step, for --tensorboard's throughput */
    T->saved = -1;
    while (T->step < T->total_steps && !interrupted) {
        int rc = train_step(T, t0, &t_tb);
        if (rc) return rc;
    }
    if (!interrupted) return 0;
    if (T->tty) fputc('\n', stderr);
    if (tm_dist_rank() != 0) return 130; /* rank 0 saves */
    if (T->saved == T->step) {
        fprintf(stderr, "%s: interrupted at step %lld; its checkpoint is saved in %s\n", M->name, (long long)T->step, T->ckdir);
        return 130;
    }
    fprintf(stderr, "%s: interrupted at step %lld; saving a checkpoint in %s\n", M->name, (long long)T->step, T->ckdir);
    state_to_host(T->params, T->buffers, &T->st);
    return tm_ckpt_save(&T->run, T->ckdir, T->keep, T->params, T->buffers, &T->st, &T->cur, T->step) ? 1 : 130;
}

/* Everything the run holds, however far it got. */
static void train_free(Train *T)
{
    if (T->log) fclose(T->log);
    tb_flush(true);
    krt_tboard_close(TR.tb, NULL);
    if (TR.ctx) {
        if (!TR.dev->host) {
            free(T->params);
            free(T->buffers);
            TR.dev->release(TR.ctx, TR.state.m);
            TR.dev->release(TR.ctx, TR.state.v);
            TR.dev->release(TR.ctx, TR.state.w);
        }
        TR.dev->release(TR.ctx, TR.params);
        TR.dev->release(TR.ctx, TR.grads);
        TR.dev->release(TR.ctx, TR.acc);
        TR.dev->release(TR.ctx, TR.buffers);
        TR.dev->release(TR.ctx, TR.arena);
        TR.dev->close(TR.ctx);
    }
    krt_optim_free(&T->st);
    free(TR.spans);
    free(TR.group_lr);
    free(T->sample_logits);
    for (int k = 0; T->bufs && k < M->ninputs; k++) free(T->bufs[k]);
    free(T->bufs);
    free(T->my_bufs);
    free(T->dtypes);
    free(T->io_syms);
    free(T->io_metrics);
    free(T->msum);
    free(T->io_outputs);
    if (T->data.train) krt_dataset_free(T->data.train);
    if (T->data.eval) krt_dataset_free(T->data.eval);
    for (int k = 0; T->data.arrays && k < 2 * M->ninputs; k++) krt_array_free(&T->data.arrays[k]);
    free(T->data.arrays);
    krt_array_free(&T->data.stream);
}

/* The training program: its phases in order, each of which may end the run. */
static int train(int argc, char **argv)
{
    const char *resume = NULL;
    int parsed = parse_args(argc, argv, &resume);
    if (parsed >= 0) return parsed;
    /* Beyond a file-size limit (ulimit -f) a write fails with EFBIG, reported as any failed
     * write, instead of the signal killing the program. */
    signal(SIGXFSZ, SIG_IGN);
    Train *T = calloc(1, sizeof *T);
    if (!T) return tm_die("out of memory");
    T->resume = resume;
    T->eval_only = OPT.eval_only;
    T->tty = isatty(2);
    memset(&TR, 0, sizeof TR);
    TR.dev = M->device ? M->device : &kiln_host_device;
    int (*const phases[])(Train *) = {train_setup, train_optimizer, train_allocate, train_resume, train_prepare, train_loop};
    int rc = TRAIN_GO;
    for (size_t i = 0; rc == TRAIN_GO && i < sizeof phases / sizeof *phases; i++) rc = phases[i](T);
    if (T->tty) fputc('\n', stderr);
    train_free(T);
    free(T);
    return rc;
}
