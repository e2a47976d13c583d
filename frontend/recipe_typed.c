/* recipe_typed.c — the checked recipe (frontend/recipe.c's RecipeValue tree) as the typed
 * `kiln_recipe` of runtime/kiln_recipe.h, which the code generator writes into model.c for
 * the programs to read. Expanded from the same tables as the checker: an argument the
 * checker takes has a field here, or this file does not compile. */
#include "internal.h"
#include "../runtime/kiln_recipe.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* A key's default text (kiln_recipe.h) as a typed value, for keys the checked recipe
 * leaves out. */
static int64_t dflt_int(const char *s) { return s && *s ? (int64_t)strtod(s, NULL) : 0; }
static double dflt_num(const char *s) { return s && *s ? strtod(s, NULL) : 0; }

static int32_t choice_index(const char *const *names, int n, const char *s)
{
    for (int i = 0; s && i < n; i++)
        if (!strcmp(names[i], s)) return i;
    return 0;
}

#define CHOICE_NAME(list, name) #name,
#define CHOICE_LOOKUP(list)                                                                                                       \
    static inline int32_t choice_##list(const char *s)                                                                                  \
    {                                                                                                                              \
        static const char *const names[] = {KILN_RECIPE_CHOICES_##list(CHOICE_NAME) ""};                                          \
        return choice_index(names, KILN_RECIPE_N_##list, s);                                                                       \
    }
KILN_RECIPE_CHOICE_LISTS(CHOICE_LOOKUP)

static int32_t call_id(const char *key, const char *call)
{
#define CALL_MATCH(k, c, args, map, doc)                                                                                          \
    if (!strcmp(key, #k) && !strcmp(call, #c)) return KILN_RECIPE_CALL_##k##_##c;
    KILN_RECIPE_CALLS(CALL_MATCH)
#undef CALL_MATCH
    return KILN_RECIPE_CALL_NONE;
}

/* Argument values into fields; an argument the call leaves out keeps the field's value. */
static void set_INT(int64_t *dst, const RecipeValue *v)
{
    if (v && v->kind == RV_NUM) *dst = (int64_t)v->num;
}
static void set_NUM(double *dst, const RecipeValue *v)
{
    if (v && v->kind == RV_NUM) *dst = v->num;
}
static void set_BOOL(bool *dst, const RecipeValue *v)
{
    if (v && v->kind == RV_BOOL) *dst = v->num != 0;
}
static void set_STR(const char **dst, const RecipeValue *v)
{
    if (v && v->str) *dst = v->str;
}
static void set_PAIR(double *dst, const RecipeValue *v)
{
    for (int i = 0; v && v->kind == RV_LIST && i < 2 && i < v->nargs; i++) dst[i] = v->args[i].num;
}
#define set_NAME_none(dst, v) set_STR(dst, v)
#define SET_NAME_LIST(list)                                                                                                       \
    static inline void set_NAME_##list(int32_t *dst, const RecipeValue *v)                                                             \
    {                                                                                                                              \
        if (v && v->str) *dst = choice_##list(v->str);                                                                             \
    }
KILN_RECIPE_CHOICE_LISTS(SET_NAME_LIST)
#define SET_INT(dst, v, ch) set_INT(dst, v)
#define SET_NUM(dst, v, ch) set_NUM(dst, v)
#define SET_BOOL(dst, v, ch) set_BOOL(dst, v)
#define SET_STR(dst, v, ch) set_STR(dst, v)
#define SET_PAIR(dst, v, ch) set_PAIR(*(dst), v)
#define SET_NAME(dst, v, ch) set_NAME_##ch(dst, v)

/* Where an argument of a key's call goes: the recipe's field KEY_ARG, or a group's. */
#define FIELD_data(arg) &out->data_##arg
#define FIELD_eval_data(arg) &out->eval_data_##arg
#define FIELD_optimizer(arg) &out->optimizer_##arg
#define FIELD_schedule(arg) &out->schedule_##arg
#define FIELD_checkpoint(arg) &out->checkpoint_##arg
#define FIELD_eval(arg) &out->eval_##arg
#define FIELD_sample(arg) &out->sample_##arg
#define FIELD_groups(arg) &group->arg

static void set_call(kiln_recipe *out, kiln_recipe_group *group, int32_t id, const RecipeValue *call)
{
#define SET_ARG(key, arg, kind, dflt, lo, hi, ch) SET_##kind(FIELD_##key(arg), recipe_arg(call, #arg), ch);
#define CALL_CASE(key, call, args, map, doc)                                                                                      \
    case KILN_RECIPE_CALL_##key##_##call: KILN_RECIPE_ARGS_##args(SET_ARG) break;
    switch (id) {
        KILN_RECIPE_CALLS(CALL_CASE)
    default: break;
    }
#undef CALL_CASE
#undef SET_ARG
    (void)out, (void)group;
}

/* An input-map call's files: its string arguments (its own arguments are numbers). */
static void set_files(kiln_recipe_files *files, const RecipeValue *call)
{
    kiln_recipe_file *v = NULL;
    int32_t n = 0;
    for (int32_t i = 0; i < call->nargs; i++) {
        if (call->args[i].kind != RV_STR) continue;
        v = xrealloc(v, (size_t)(n + 1) * sizeof *v);
        v[n].input = call->args[i].key;
        v[n++].path = call->args[i].str;
    }
    files->v = v, files->n = n;
}

static void set_groups(kiln_recipe *out, const RecipeValue *list)
{
    kiln_recipe_group *gs = xcalloc((size_t)list->nargs + 1, sizeof *gs);
    for (int32_t k = 0; k < list->nargs; k++) {
        const RecipeValue *call = &list->args[k];
        kiln_recipe_group *group = &gs[k];
        set_call(out, group, call_id("groups", call->str), call);
        group->has_lr = recipe_arg(call, "lr") != NULL;
        group->has_weight_decay = recipe_arg(call, "weight_decay") != NULL;
        const RecipeValue *params = recipe_arg(call, "params"); /* "a,b,c": the checker's match */
        if (!params || !params->str || !*params->str) continue;
        int32_t n = 1;
        for (const char *p = params->str; *p; p++) n += *p == ',';
        char **names = xmalloc((size_t)n * sizeof *names);
        const char *p = params->str;
        for (int32_t i = 0; i < n; i++) {
            size_t len = strcspn(p, ",");
            names[i] = xstrndup(p, len);
            p += len + (p[len] == ',');
        }
        group->params = (const char *const *)names, group->nparams = n;
    }
    out->groups.v = gs, out->groups.n = list->nargs;
}

/* Keys by kind: written, else the table's default. */
#define KEY_INT(key, dflt, ch) out->key = v ? (int64_t)v->num : dflt_int(dflt);
#define KEY_NUM(key, dflt, ch) out->key = v ? v->num : dflt_num(dflt);
#define KEY_STR(key, dflt, ch) out->key = v && v->str ? v->str : (dflt);
#define KEY_NAME(key, dflt, ch) out->key = choice_##ch(v && v->str ? v->str : (dflt));
#define KEY_SCALE(key, dflt, ch)                                                                                                  \
    if (v && v->kind == RV_NUM) out->key = KILN_RECIPE_LOSS_SCALE_STATIC, out->key##_value = v->num;                              \
    else out->key = choice_##ch(v && v->str ? v->str : (dflt));
#define KEY_CALL(key, dflt, ch)                                                                                                   \
    out->key = v && v->str ? call_id(#key, v->str) : KILN_RECIPE_CALL_NONE;                                                        \
    set_call(out, NULL, out->key, v);
#define KEY_DATA(key, dflt, ch)                                                                                                   \
    KEY_CALL(key, dflt, ch)                                                                                                       \
    if (v) set_files(&out->key##_files, v);
#define KEY_GROUPS(key, dflt, ch)                                                                                                 \
    if (v && v->kind == RV_LIST) set_groups(out, v);

void recipe_typed(const Recipe *r, kiln_recipe *out)
{
#define ARG_UNSET(name, kind, choices, unset) .name = unset,
    static const kiln_recipe unset = {KILN_RECIPE_FIELDS(ARG_UNSET)};
#undef ARG_UNSET
    *out = unset;
    const RecipeValue *v;
#define KEY_SET(key, kind, dflt, lo, hi, ch, completed, doc)                                                                      \
    v = r ? recipe_get(r, #key) : NULL;                                                                                            \
    KEY_##kind(key, dflt, ch)
    KILN_RECIPE_KEYS(KEY_SET)
#undef KEY_SET
}

void recipe_typed_free(kiln_recipe *r)
{
    for (int32_t k = 0; k < r->groups.n; k++) {
        for (int32_t i = 0; i < r->groups.v[k].nparams; i++) free((char *)r->groups.v[k].params[i]);
        free((void *)r->groups.v[k].params);
    }
    free((void *)r->groups.v);
    free((void *)r->data_files.v);
    free((void *)r->eval_data_files.v);
    memset(r, 0, sizeof *r);
}
