/* test_interp.c — the reference interpreter against hand-computed values.
 *
 * Graphs are built directly with ir_add_node (not the checked builder) so that these tests
 * depend only on graph.c and shape.c. Every expected value below was worked out by hand
 * (or is a well-known constant such as e or tanh(1)); none is computed by re-running the
 * formula the interpreter uses. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>
#include <time.h>

#include "../ir/ir.h"
#include "../util/rng.h"
#include "support.h"

static const Loc NOLOC = {0, 0, 0};

/* ---- graph construction helpers ---- */

static Shape shp(int rank, const int64_t *d)
{
    Dim dd[IR_MAX_RANK];
    for (int i = 0; i < rank; i++) dd[i] = ir_dim_const(d[i]);
    return ir_shape_make(rank, dd);
}
#define NI64(...) ((int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)))
#define SH(...) shp(NI64(__VA_ARGS__), (int64_t[]){__VA_ARGS__})
#define ND(...) ((int64_t)(sizeof((double[]){__VA_ARGS__}) / sizeof(double)))

static NodeId node(Graph *g, Op op, DType t, Shape s, const NodeId *ins, int nins, const int64_t *at, int nat)
{
    return ir_add_node(g, op, t, &s, ins, nins, at, nat, NOLOC);
}
static NodeId un(Graph *g, Op op, DType t, Shape s, NodeId x) { return node(g, op, t, s, &x, 1, NULL, 0); }
static NodeId bin(Graph *g, Op op, DType t, Shape s, NodeId x, NodeId y)
{
    NodeId in[2] = {x, y};
    return node(g, op, t, s, in, 2, NULL, 0);
}
static NodeId una(Graph *g, Op op, DType t, Shape s, NodeId x, const int64_t *at, int nat)
{
    return node(g, op, t, s, &x, 1, at, nat);
}
static NodeId input(Graph *g, const char *name, DType t, Shape s)
{
    NodeId id = node(g, OP_INPUT, t, s, NULL, 0, NULL, 0);
    ir_set_name(g, id, name);
    return id;
}
static NodeId param(Graph *g, const char *name, Shape s, InitKind k, double a0, double a1)
{
    int64_t at[2] = {k, 1};
    NodeId id = node(g, OP_PARAM, DT_F32, s, NULL, 0, at, 2);
    ir_set_name(g, id, name);
    g->nodes[id].fattr[0] = a0;
    g->nodes[id].fattr[1] = a1;
    return id;
}
static NodeId cnst(Graph *g, double v, DType t, Shape s)
{
    NodeId id = node(g, OP_CONST, t, s, NULL, 0, NULL, 0);
    g->nodes[id].fattr[0] = v;
    return id;
}
static Dim symdim(int64_t k, int sym)
{
    Dim d = ir_dim_sym(sym);
    d.k = k;
    return d;
}

/* ---- checking helpers ---- */

static void run_ok(Interp *ip)
{
    int rc = interp_run(ip);
    cr_assert_eq(rc, 0, "interp_run failed: %s", ip->err.data ? ip->err.data : "(no message)");
}

static const char *run_err(Interp *ip)
{
    int rc = interp_run(ip);
    cr_assert_eq(rc, -1, "interp_run should have failed");
    cr_assert_not_null(ip->err.data);
    return ip->err.data;
}

static void expect_vals(const Interp *ip, NodeId id, double tol, const double *want, int64_t n)
{
    const ITensor *t = interp_value(ip, id);
    cr_assert_not_null(t);
    cr_assert_not_null(t->data, "node %d was not computed", id);
    cr_assert_eq(t->n, n, "node %d has %lld elements, expected %lld", id, (long long)t->n, (long long)n);
    for (int64_t i = 0; i < n; i++) {
        double a = t->data[i], b = want[i];
        bool ok = (isnan(a) && isnan(b)) || a == b || (isfinite(b) && fabs(a - b) <= tol * fmax(1.0, fabs(b)));
        cr_assert(ok, "node %d element %lld: got %.17g, expected %.17g", id, (long long)i, a, b);
    }
}
#define EXPECT(ip, id, tol, ...) expect_vals((ip), (id), (tol), (double[]){__VA_ARGS__}, ND(__VA_ARGS__))

static void expect_dims(const Interp *ip, NodeId id, int rank, const int64_t *dims)
{
    const ITensor *t = interp_value(ip, id);
    cr_assert_eq(t->rank, rank, "node %d has rank %d, expected %d", id, t->rank, rank);
    for (int i = 0; i < rank; i++)
        cr_assert_eq(t->dims[i], dims[i], "node %d dim %d is %lld, expected %lld", id, i, (long long)t->dims[i],
                     (long long)dims[i]);
}
#define EXPECT_DIMS(ip, id, ...) expect_dims((ip), (id), NI64(__VA_ARGS__), (int64_t[]){__VA_ARGS__})
#define SET(ip, id, ...) interp_set((ip), (id), (double[]){__VA_ARGS__})

/* ---- leaves ---- */

Test(interp, const_and_iota)
{
    Graph *g = ir_graph_new("t");
    NodeId c = cnst(g, 2.5, DT_F32, SH(2, 2));
    NodeId c0 = cnst(g, -1.0, DT_F32, SH());
    NodeId i1 = node(g, OP_IOTA, DT_I64, SH(2, 3), NULL, 0, (int64_t[]){1}, 1);
    NodeId i0 = node(g, OP_IOTA, DT_I64, SH(2, 3), NULL, 0, (int64_t[]){0}, 1);
    NodeId r1 = node(g, OP_IOTA, DT_F32, SH(4), NULL, 0, (int64_t[]){0}, 1);
    NodeId u8 = node(g, OP_IOTA, DT_U8, SH(300), NULL, 0, (int64_t[]){0}, 1); /* wraps at 256 */
    NodeId ci = cnst(g, 3.75, DT_I32, SH(1)); /* an integer const is truncated like a cast */
    Interp ip;
    interp_init(&ip, g);
    cr_assert_null(interp_value(&ip, c)->data, "nothing is computed before interp_run");
    cr_assert_null(interp_value(&ip, -1));
    cr_assert_null(interp_value(&ip, g->nnodes));
    run_ok(&ip);
    EXPECT(&ip, c, 0, 2.5, 2.5, 2.5, 2.5);
    EXPECT_DIMS(&ip, c, 2, 2);
    EXPECT(&ip, c0, 0, -1.0);
    cr_assert_eq(interp_value(&ip, c0)->rank, 0);
    EXPECT(&ip, i1, 0, 0, 1, 2, 0, 1, 2);
    EXPECT(&ip, i0, 0, 0, 0, 0, 1, 1, 1);
    EXPECT(&ip, r1, 0, 0, 1, 2, 3);
    const ITensor *t = interp_value(&ip, u8);
    cr_assert_eq(t->data[255], 255);
    cr_assert_eq(t->data[256], 0);
    cr_assert_eq(t->data[299], 43);
    EXPECT(&ip, ci, 0, 3);
    /* A second run recomputes the same values (and frees the first ones). */
    run_ok(&ip);
    EXPECT(&ip, i1, 0, 0, 1, 2, 0, 1, 2);
    interp_free(&ip);
    ir_graph_free(g);
}

/* ---- elementwise ---- */

Test(interp, unary_ops)
{
    Graph *g = ir_graph_new("t");
    Shape s = SH(4);
    NodeId x = input(g, "x", DT_F64, s), y = input(g, "y", DT_F64, s);
    NodeId neg = un(g, OP_NEG, DT_F64, s, x), ab = un(g, OP_ABS, DT_F64, s, x);
    NodeId sg = un(g, OP_SIGN, DT_F64, s, x), re = un(g, OP_RELU, DT_F64, s, x);
    NodeId ex = un(g, OP_EXP, DT_F64, s, y), lg = un(g, OP_LOG, DT_F64, s, y);
    NodeId sq = un(g, OP_SQRT, DT_F64, s, y), th = un(g, OP_TANH, DT_F64, s, y);
    NodeId sm = un(g, OP_SIGMOID, DT_F64, s, y);
    NodeId z = input(g, "z", DT_F64, SH(5));
    NodeId smz = un(g, OP_SIGMOID, DT_F64, SH(5), z), sgz = un(g, OP_SIGN, DT_F64, SH(5), z);
    NodeId rez = un(g, OP_RELU, DT_F64, SH(5), z);
    NodeId b = input(g, "b", DT_BOOL, SH(3));
    NodeId nb = un(g, OP_NOT, DT_BOOL, SH(3), b);
    Interp ip;
    interp_init(&ip, g);
    SET(&ip, x, -2, -0.5, 0, 1.5);
    SET(&ip, y, 0, 1, 4, 0.25);
    SET(&ip, z, -800, -40, 800, NAN, -0.0);
    SET(&ip, b, 1, 0, 1);
    run_ok(&ip);
    EXPECT(&ip, neg, 0, 2, 0.5, 0, -1.5);
    EXPECT(&ip, ab, 0, 2, 0.5, 0, 1.5);
    EXPECT(&ip, sg, 0, -1, -1, 0, 1);
    EXPECT(&ip, re, 0, 0, 0, 0, 1.5);
    EXPECT(&ip, ex, 1e-15, 1, 2.718281828459045, 54.598150033144236, 1.2840254166877414);
    EXPECT(&ip, lg, 1e-15, -INFINITY, 0, 1.3862943611198906, -1.3862943611198906);
    EXPECT(&ip, sq, 0, 0, 1, 2, 0.5);
    EXPECT(&ip, th, 1e-15, 0, 0.7615941559557649, 0.999329299739067, 0.24491866240370913);
    EXPECT(&ip, sm, 1e-15, 0.5, 0.7310585786300049, 0.9820137900379085, 0.5621765008857981);
    /* Extremes stay finite and accurate: no inf/inf. */
    cr_assert_eq(interp_value(&ip, smz)->data[0], 0.0);
    cr_assert_float_eq(interp_value(&ip, smz)->data[1], 4.248354255291589e-18, 1e-30);
    cr_assert_eq(interp_value(&ip, smz)->data[2], 1.0);
    cr_assert(isnan(interp_value(&ip, smz)->data[3]));
    cr_assert_eq(interp_value(&ip, smz)->data[4], 0.5);
    EXPECT(&ip, sgz, 0, -1, -1, 1, NAN, 0); /* sign(NaN) = NaN, sign(-0) = 0 */
    EXPECT(&ip, rez, 0, 0, 0, 800, NAN, 0); /* relu(NaN) = NaN, as in PyTorch */
    EXPECT(&ip, nb, 0, 0, 1, 0);
    interp_free(&ip);
    ir_graph_free(g);
}

Test(interp, binary_float)
{
    Graph *g = ir_graph_new("t");
    Shape s = SH(6);
    NodeId x = input(g, "x", DT_F64, s), y = input(g, "y", DT_F64, s);
    NodeId ad = bin(g, OP_ADD, DT_F64, s, x, y), sb = bin(g, OP_SUB, DT_F64, s, x, y);
    NodeId mu = bin(g, OP_MUL, DT_F64, s, x, y), dv = bin(g, OP_DIV, DT_F64, s, x, y);
    NodeId mx = bin(g, OP_MAX, DT_F64, s, x, y), mn = bin(g, OP_MIN, DT_F64, s, x, y);
    NodeId pw = bin(g, OP_POW, DT_F64, s, x, y);
    Shape s4 = SH(4);
    NodeId p = input(g, "p", DT_F64, s4), q = input(g, "q", DT_F64, s4);
    NodeId mx2 = bin(g, OP_MAX, DT_F64, s4, p, q), mn2 = bin(g, OP_MIN, DT_F64, s4, p, q);
    NodeId pw2 = bin(g, OP_POW, DT_F64, s4, p, q);
    Interp ip;
    interp_init(&ip, g);
    SET(&ip, x, 7, -7, 1, -1, 0, 2);
    SET(&ip, y, 2, 2, 0, 0, 0, 10);
    SET(&ip, p, NAN, 1, -8, 0);
    SET(&ip, q, 1, NAN, 1.0 / 3.0, -1);
    run_ok(&ip);
    EXPECT(&ip, ad, 0, 9, -5, 1, -1, 0, 12);
    EXPECT(&ip, sb, 0, 5, -9, 1, -1, 0, -8);
    EXPECT(&ip, mu, 0, 14, -14, 0, 0, 0, 20);
    EXPECT(&ip, dv, 0, 3.5, -3.5, INFINITY, -INFINITY, NAN, 0.2); /* IEEE division by zero */
    EXPECT(&ip, mx, 0, 7, 2, 1, 0, 0, 10);
    EXPECT(&ip, mn, 0, 2, -7, 0, -1, 0, 2);
    EXPECT(&ip, pw, 0, 49, 49, 1, 1, 1, 1024);
    EXPECT(&ip, mx2, 0, NAN, NAN, 1.0 / 3.0, 0); /* NaN propagates either side */
    EXPECT(&ip, mn2, 0, NAN, NAN, -8, -1);
    EXPECT(&ip, pw2, 0, NAN, 1, NAN, INFINITY); /* C pow: pow(1, NaN) = 1, pow(0, -1) = inf */
    interp_free(&ip);
    ir_graph_free(g);
}

Test(interp, integer_arithmetic)
{
    Graph *g = ir_graph_new("t");
    Shape s = SH(5);
    NodeId x = input(g, "x", DT_I32, s), y = input(g, "y", DT_I32, s);
    NodeId dv = bin(g, OP_DIV, DT_I32, s, x, y);
    NodeId a = input(g, "a", DT_I32, SH(2)), b = input(g, "b", DT_I32, SH(2));
    NodeId ad = bin(g, OP_ADD, DT_I32, SH(2), a, b);
    NodeId u = input(g, "u", DT_U8, SH(2)), v = input(g, "v", DT_U8, SH(2));
    NodeId us = bin(g, OP_SUB, DT_U8, SH(2), u, v), um = bin(g, OP_MUL, DT_U8, SH(2), u, v);
    Interp ip;
    interp_init(&ip, g);
    SET(&ip, x, 7, -7, 7, -7, 0);
    SET(&ip, y, 2, 2, -2, -2, 3);
    SET(&ip, a, 2147483647, -2147483648.0);
    SET(&ip, b, 1, -1);
    SET(&ip, u, 3, 16);
    SET(&ip, v, 5, 16);
    run_ok(&ip);
    EXPECT(&ip, dv, 0, 3, -3, -3, 3, 0); /* truncation toward zero */
    EXPECT(&ip, ad, 0, -2147483648.0, 2147483647);
    EXPECT(&ip, us, 0, 254, 0);
    EXPECT(&ip, um, 0, 15, 0); /* 16 * 16 = 256 wraps to 0 */
    interp_free(&ip);
    ir_graph_free(g);
}

Test(interp, integer_division_by_zero)
{
    Graph *g = ir_graph_new("t");
    NodeId x = input(g, "x", DT_I64, SH(2)), y = input(g, "y", DT_I64, SH(2));
    bin(g, OP_DIV, DT_I64, SH(2), x, y);
    Interp ip;
    interp_init(&ip, g);
    SET(&ip, x, 4, 1);
    SET(&ip, y, 2, 0);
    cr_assert_str_eq(run_err(&ip), "div at node %2: integer division by zero");
    interp_free(&ip);
    ir_graph_free(g);
}

Test(interp, compare_logic_where)
{
    Graph *g = ir_graph_new("t");
    Shape s = SH(4);
    NodeId x = input(g, "x", DT_F32, s), y = input(g, "y", DT_F32, s);
    NodeId eq = bin(g, OP_EQ, DT_BOOL, s, x, y), ne = bin(g, OP_NE, DT_BOOL, s, x, y);
    NodeId lt = bin(g, OP_LT, DT_BOOL, s, x, y), le = bin(g, OP_LE, DT_BOOL, s, x, y);
    NodeId gt = bin(g, OP_GT, DT_BOOL, s, x, y), ge = bin(g, OP_GE, DT_BOOL, s, x, y);
    NodeId p = input(g, "p", DT_BOOL, s), q = input(g, "q", DT_BOOL, s);
    NodeId an = bin(g, OP_AND, DT_BOOL, s, p, q), orr = bin(g, OP_OR, DT_BOOL, s, p, q);
    NodeId a = input(g, "a", DT_F32, s), b = input(g, "b", DT_F32, s);
    NodeId wh = node(g, OP_WHERE, DT_F32, s, (NodeId[]){q, a, b}, 3, NULL, 0);
    Interp ip;
    interp_init(&ip, g);
    SET(&ip, x, 1, 2, 3, NAN);
    SET(&ip, y, 2, 2, 2, NAN);
    SET(&ip, p, 0, 0, 1, 1);
    SET(&ip, q, 0, 1, 0, 5); /* 5 is stored in a bool as 1 */
    SET(&ip, a, 1, 2, 3, 4);
    SET(&ip, b, 10, 20, 30, 40);
    run_ok(&ip);
    EXPECT(&ip, eq, 0, 0, 1, 0, 0);
    EXPECT(&ip, ne, 0, 1, 0, 1, 1);
    EXPECT(&ip, lt, 0, 1, 0, 0, 0);
    EXPECT(&ip, le, 0, 1, 1, 0, 0);
    EXPECT(&ip, gt, 0, 0, 0, 1, 0);
    EXPECT(&ip, ge, 0, 0, 1, 1, 0);
    EXPECT(&ip, q, 0, 0, 1, 0, 1);
    EXPECT(&ip, an, 0, 0, 0, 0, 1);
    EXPECT(&ip, orr, 0, 0, 1, 1, 1);
    EXPECT(&ip, wh, 0, 10, 2, 30, 4);
    interp_free(&ip);
    ir_graph_free(g);
}

Test(interp, casts)
{
    Graph *g = ir_graph_new("t");
    Shape s = SH(9);
    NodeId x = input(g, "x", DT_F64, s);
    NodeId u8 = un(g, OP_CAST, DT_U8, s, x);
    NodeId y = input(g, "y", DT_F64, SH(6));
    NodeId i32 = un(g, OP_CAST, DT_I32, SH(6), y);
    NodeId z = input(g, "z", DT_F64, SH(5));
    NodeId bl = un(g, OP_CAST, DT_BOOL, SH(5), z);
    NodeId bf = un(g, OP_CAST, DT_F32, SH(5), bl);
    NodeId w = input(g, "w", DT_F64, SH(5));
    NodeId i64 = un(g, OP_CAST, DT_I64, SH(5), w);
    NodeId f32 = un(g, OP_CAST, DT_F32, SH(5), w);
    NodeId k = input(g, "k", DT_I32, SH(3));
    NodeId ku = un(g, OP_CAST, DT_U8, SH(3), k);
    Interp ip;
    interp_init(&ip, g);
    SET(&ip, x, 300.7, -1, -1.5, 255.9, 256, -0.4, 1e10 + 7, NAN, INFINITY);
    SET(&ip, y, 2147483648.0, 4294967297.0, -2.9, 3.9, -2147483649.0, 1e10 + 7);
    SET(&ip, z, 0, -0.0, 0.1, NAN, -3);
    SET(&ip, w, 1e30, -1e30, -2.5, 9007199254740992.0, 0.1);
    SET(&ip, k, -1, 256, 511);
    run_ok(&ip);
    /* truncate toward zero, then wrap mod 256; NaN and inf become 0 */
    EXPECT(&ip, u8, 0, 44, 255, 255, 255, 0, 0, 7, 0, 0);
    /* two's complement wrap: 10000000007 mod 2^32 = 1410065415 */
    EXPECT(&ip, i32, 0, -2147483648.0, 1, -2, 3, 2147483647, 1410065415);
    EXPECT(&ip, bl, 0, 0, 0, 1, 1, 1);
    EXPECT(&ip, bf, 0, 0, 0, 1, 1, 1);
    /* i64 saturates at [-2^63, largest double below 2^63] */
    EXPECT(&ip, i64, 0, 9223372036854774784.0, -9223372036854775808.0, -2, 9007199254740992.0, 0);
    /* float dtypes are not rounded: f32 keeps the double nearest 0.1 */
    EXPECT(&ip, f32, 0, 1e30, -1e30, -2.5, 9007199254740992.0, 0.1);
    EXPECT(&ip, ku, 0, 255, 0, 255);
    cr_assert(!signbit(interp_value(&ip, u8)->data[5]), "integers have no negative zero");
    interp_free(&ip);
    ir_graph_free(g);
}

/* ---- reductions ---- */

Test(interp, reductions)
{
    Graph *g = ir_graph_new("t");
    NodeId x = input(g, "x", DT_F64, SH(2, 3, 2)); /* x[a,b,c] = 6a + 2b + c */
    NodeId s02 = una(g, OP_REDUCE_SUM, DT_F64, SH(1, 3, 1), x, (int64_t[]){5}, 1);
    NodeId m1 = una(g, OP_REDUCE_MAX, DT_F64, SH(2, 1, 2), x, (int64_t[]){2}, 1);
    NodeId sall = una(g, OP_REDUCE_SUM, DT_F64, SH(1, 1, 1), x, (int64_t[]){7}, 1);
    NodeId mall = una(g, OP_REDUCE_MAX, DT_F64, SH(1, 1, 1), x, (int64_t[]){7}, 1);
    NodeId none = una(g, OP_REDUCE_SUM, DT_F64, SH(2, 3, 2), x, (int64_t[]){0}, 1);
    NodeId y = input(g, "y", DT_F64, SH(3, 1));
    NodeId s1 = una(g, OP_REDUCE_SUM, DT_F64, SH(3, 1), y, (int64_t[]){2}, 1); /* size-1 axis */
    NodeId n = input(g, "n", DT_F64, SH(2, 2));
    NodeId nm1 = una(g, OP_REDUCE_MAX, DT_F64, SH(2, 1), n, (int64_t[]){2}, 1);
    NodeId nm0 = una(g, OP_REDUCE_MAX, DT_F64, SH(1, 2), n, (int64_t[]){1}, 1);
    NodeId e = input(g, "e", DT_F64, SH(2, 0));
    NodeId es = una(g, OP_REDUCE_SUM, DT_F64, SH(2, 1), e, (int64_t[]){2}, 1);
    NodeId em = una(g, OP_REDUCE_MAX, DT_F64, SH(2, 1), e, (int64_t[]){2}, 1);
    NodeId iv = input(g, "iv", DT_I32, SH(2));
    NodeId is = una(g, OP_REDUCE_SUM, DT_I32, SH(1), iv, (int64_t[]){1}, 1);
    Interp ip;
    interp_init(&ip, g);
    SET(&ip, x, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11);
    SET(&ip, y, 4, 5, 6);
    SET(&ip, n, 1, NAN, 3, 2);
    SET(&ip, e, 0); /* no elements: any non-NULL pointer gives it a value */
    SET(&ip, iv, 2147483647, 2);
    run_ok(&ip);
    EXPECT_DIMS(&ip, s02, 1, 3, 1);
    EXPECT(&ip, s02, 0, 14, 22, 30);
    EXPECT_DIMS(&ip, m1, 2, 1, 2);
    EXPECT(&ip, m1, 0, 4, 5, 10, 11);
    EXPECT(&ip, sall, 0, 66);
    EXPECT(&ip, mall, 0, 11);
    EXPECT(&ip, none, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11);
    EXPECT(&ip, s1, 0, 4, 5, 6);
    EXPECT(&ip, nm1, 0, NAN, 3); /* NaN propagates wherever it sits */
    EXPECT(&ip, nm0, 0, 3, NAN);
    EXPECT(&ip, es, 0, 0, 0);
    EXPECT(&ip, em, 0, -INFINITY, -INFINITY);
    EXPECT(&ip, is, 0, -2147483647); /* i32 sums wrap */
    interp_free(&ip);
    ir_graph_free(g);
}

Test(interp, argmax)
{
    Graph *g = ir_graph_new("t");
    NodeId x = input(g, "x", DT_F32, SH(2, 4));
    NodeId a1 = una(g, OP_ARGMAX, DT_I64, SH(2, 1), x, (int64_t[]){1}, 1);
    NodeId a0 = una(g, OP_ARGMAX, DT_I64, SH(1, 4), x, (int64_t[]){0}, 1);
    NodeId y = input(g, "y", DT_F32, SH(5));
    NodeId ay = una(g, OP_ARGMAX, DT_I64, SH(1), y, (int64_t[]){0}, 1);
    NodeId z = input(g, "z", DT_F32, SH(2, 3));
    NodeId az = una(g, OP_ARGMAX, DT_I64, SH(2, 1), z, (int64_t[]){1}, 1);
    Interp ip;
    interp_init(&ip, g);
    SET(&ip, x, 1, 3, 3, 2, 5, 5, 0, 5);
    SET(&ip, y, 1, NAN, 5, NAN, 7);
    SET(&ip, z, 2, 2, 2, -3, -1, -2);
    run_ok(&ip);
    EXPECT(&ip, a1, 0, 1, 0); /* ties: the first maximum */
    EXPECT(&ip, a0, 0, 1, 1, 0, 1);
    EXPECT(&ip, ay, 0, 1); /* the first NaN, as torch.argmax */
    EXPECT(&ip, az, 0, 0, 1);
    interp_free(&ip);
    ir_graph_free(g);
}

/* ---- data movement ---- */

Test(interp, reshape_and_expand)
{
    Graph *g = ir_graph_new("t");
    NodeId x = input(g, "x", DT_F32, SH(2, 3));
    NodeId r = un(g, OP_RESHAPE, DT_F32, SH(3, 2), x);
    NodeId col = input(g, "col", DT_F32, SH(3, 1)), row = input(g, "row", DT_F32, SH(1, 4));
    NodeId ec = un(g, OP_EXPAND, DT_F32, SH(3, 4), col), er = un(g, OP_EXPAND, DT_F32, SH(3, 4), row);
    NodeId sum = bin(g, OP_ADD, DT_F32, SH(3, 4), ec, er); /* broadcast add, as the builder lowers it */
    NodeId c = cnst(g, 7, DT_F32, SH());
    NodeId c11 = un(g, OP_RESHAPE, DT_F32, SH(1, 1), c);
    NodeId e23 = un(g, OP_EXPAND, DT_F32, SH(2, 3), c11);
    NodeId same = un(g, OP_EXPAND, DT_F32, SH(1, 4), row);
    Interp ip;
    interp_init(&ip, g);
    SET(&ip, x, 1, 2, 3, 4, 5, 6);
    SET(&ip, col, 1, 2, 3);
    SET(&ip, row, 10, 20, 30, 40);
    run_ok(&ip);
    EXPECT_DIMS(&ip, r, 3, 2);
    EXPECT(&ip, r, 0, 1, 2, 3, 4, 5, 6);
    EXPECT(&ip, ec, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    EXPECT(&ip, er, 0, 10, 20, 30, 40, 10, 20, 30, 40, 10, 20, 30, 40);
    EXPECT(&ip, sum, 0, 11, 21, 31, 41, 12, 22, 32, 42, 13, 23, 33, 43);
    EXPECT(&ip, e23, 0, 7, 7, 7, 7, 7, 7);
    EXPECT(&ip, same, 0, 10, 20, 30, 40);
    interp_free(&ip);
    ir_graph_free(g);
}

Test(interp, permute_rank4)
{
    Graph *g = ir_graph_new("t");
    NodeId x = node(g, OP_IOTA, DT_F32, SH(120), NULL, 0, (int64_t[]){0}, 1);
    NodeId x4 = un(g, OP_RESHAPE, DT_F32, SH(2, 3, 4, 5), x); /* x4[a,b,c,d] = 60a + 20b + 5c + d */
    NodeId p = una(g, OP_PERMUTE, DT_F32, SH(5, 3, 2, 4), x4, (int64_t[]){3, 1, 0, 2}, 4);
    NodeId id = una(g, OP_PERMUTE, DT_F32, SH(2, 3, 4, 5), x4, (int64_t[]){0, 1, 2, 3}, 4);
    Interp ip;
    interp_init(&ip, g);
    run_ok(&ip);
    EXPECT_DIMS(&ip, p, 5, 3, 2, 4);
    const ITensor *t = interp_value(&ip, p);
    /* out[o0,o1,o2,o3] = x4[o2, o1, o3, o0]; flat out index ((o0*3 + o1)*2 + o2)*4 + o3 */
    double first8[8] = {0, 5, 10, 15, 60, 65, 70, 75}; /* out[0,0,0,:], out[0,0,1,:] */
    for (int i = 0; i < 8; i++) cr_assert_eq(t->data[i], first8[i], "element %d", i);
    cr_assert_eq(t->data[24], 1);   /* out[1,0,0,0] = x4[0,0,0,1] */
    cr_assert_eq(t->data[20], 100); /* out[0,2,1,0] = x4[1,2,0,0] */
    cr_assert_eq(t->data[59], 37);  /* out[2,1,0,3] = x4[0,1,3,2] */
    cr_assert_eq(t->data[76], 63);  /* out[3,0,1,0] = x4[1,0,0,3] */
    cr_assert_eq(t->data[119], 119); /* out[4,2,1,3] = x4[1,2,3,4] */
    double sum = 0;
    for (int i = 0; i < 120; i++) sum += t->data[i];
    cr_assert_eq(sum, 7140); /* 0 + ... + 119: every element exactly once */
    for (int i = 0; i < 120; i++) cr_assert_eq(interp_value(&ip, id)->data[i], i);
    interp_free(&ip);
    ir_graph_free(g);
}

Test(interp, slice)
{
    Graph *g = ir_graph_new("t");
    NodeId x = input(g, "x", DT_F32, SH(10));
    NodeId a = una(g, OP_SLICE, DT_F32, SH(3), x, (int64_t[]){0, 1, IR_SLICE_END, 3}, 4);
    NodeId b = una(g, OP_SLICE, DT_F32, SH(3), x, (int64_t[]){0, 2, 8, 2}, 4);
    NodeId c = una(g, OP_SLICE, DT_F32, SH(2), x, (int64_t[]){0, 3, 100, 4}, 4); /* end clamped */
    NodeId d = una(g, OP_SLICE, DT_F32, SH(1), x, (int64_t[]){0, 9, IR_SLICE_END, 5}, 4);
    NodeId e = una(g, OP_SLICE, DT_F32, SH(0), x, (int64_t[]){0, 5, 5, 1}, 4);
    NodeId f = una(g, OP_SLICE, DT_F32, SH(10), x, (int64_t[]){0, 0, IR_SLICE_END, 1}, 4);
    NodeId y = input(g, "y", DT_F32, SH(2, 5));
    NodeId h = una(g, OP_SLICE, DT_F32, SH(2, 3), y, (int64_t[]){1, 0, IR_SLICE_END, 2}, 4);
    NodeId k = una(g, OP_SLICE, DT_F32, SH(1, 5), y, (int64_t[]){0, 1, 2, 1}, 4);
    Interp ip;
    interp_init(&ip, g);
    SET(&ip, x, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9);
    SET(&ip, y, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9);
    run_ok(&ip);
    EXPECT(&ip, a, 0, 1, 4, 7);
    EXPECT(&ip, b, 0, 2, 4, 6);
    EXPECT(&ip, c, 0, 3, 7);
    EXPECT(&ip, d, 0, 9);
    cr_assert_eq(interp_value(&ip, e)->n, 0);
    cr_assert_not_null(interp_value(&ip, e)->data, "an empty value is still computed");
    EXPECT(&ip, f, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9);
    EXPECT(&ip, h, 0, 0, 2, 4, 5, 7, 9);
    EXPECT(&ip, k, 0, 5, 6, 7, 8, 9);
    interp_free(&ip);
    ir_graph_free(g);
}

Test(interp, concat_three)
{
    Graph *g = ir_graph_new("t");
    NodeId a = input(g, "a", DT_F32, SH(2, 1)), b = input(g, "b", DT_F32, SH(2, 2));
    NodeId c = input(g, "c", DT_F32, SH(2, 1));
    NodeId cat1 = node(g, OP_CONCAT, DT_F32, SH(2, 4), (NodeId[]){a, b, c}, 3, (int64_t[]){1}, 1);
    NodeId p = input(g, "p", DT_F32, SH(1, 2)), q = input(g, "q", DT_F32, SH(0, 2));
    NodeId cat0 = node(g, OP_CONCAT, DT_F32, SH(3, 2), (NodeId[]){p, q, b}, 3, (int64_t[]){0}, 1);
    NodeId one = node(g, OP_CONCAT, DT_F32, SH(2, 1), (NodeId[]){a}, 1, (int64_t[]){1}, 1);
    Interp ip;
    interp_init(&ip, g);
    SET(&ip, a, 1, 2);
    SET(&ip, b, 3, 4, 5, 6);
    SET(&ip, c, 7, 8);
    SET(&ip, p, -1, -2);
    SET(&ip, q, 0);
    run_ok(&ip);
    EXPECT(&ip, cat1, 0, 1, 3, 4, 7, 2, 5, 6, 8);
    EXPECT(&ip, cat0, 0, -1, -2, 3, 4, 5, 6);
    EXPECT(&ip, one, 0, 1, 2);
    interp_free(&ip);
    ir_graph_free(g);
}

Test(interp, pad)
{
    Graph *g = ir_graph_new("t");
    NodeId x = input(g, "x", DT_F32, SH(2, 2));
    NodeId p = una(g, OP_PAD, DT_F32, SH(3, 4), x, (int64_t[]){1, 0, 0, 2}, 4);
    g->nodes[p].fattr[0] = -1;
    NodeId v = input(g, "v", DT_F32, SH(4));
    NodeId crop = una(g, OP_PAD, DT_F32, SH(4), v, (int64_t[]){-1, 1}, 2); /* negative pad crops */
    NodeId zero = una(g, OP_PAD, DT_F32, SH(2, 2), x, (int64_t[]){0, 0, 0, 0}, 4);
    Interp ip;
    interp_init(&ip, g);
    SET(&ip, x, 1, 2, 3, 4);
    SET(&ip, v, 1, 2, 3, 4);
    run_ok(&ip);
    EXPECT(&ip, p, 0, -1, -1, -1, -1, 1, 2, -1, -1, 3, 4, -1, -1);
    EXPECT(&ip, crop, 0, 2, 3, 4, 0);
    EXPECT(&ip, zero, 0, 1, 2, 3, 4);
    interp_free(&ip);
    ir_graph_free(g);
}

Test(interp, gather_and_scatter_add)
{
    Graph *g = ir_graph_new("t");
    NodeId tab = input(g, "table", DT_F32, SH(4, 2));
    NodeId idx = input(g, "idx", DT_I64, SH(2, 2));
    NodeId ga = bin(g, OP_GATHER, DT_F32, SH(2, 2, 2), tab, idx);
    NodeId t1 = input(g, "t1", DT_F32, SH(5)), i1 = input(g, "i1", DT_I32, SH(3));
    NodeId g1 = bin(g, OP_GATHER, DT_F32, SH(3), t1, i1);
    NodeId src = input(g, "src", DT_F32, SH(2, 2, 2));
    NodeId sc = bin(g, OP_SCATTER_ADD, DT_F32, SH(4, 2), idx, src);
    Interp ip;
    interp_init(&ip, g);
    SET(&ip, tab, 0, 1, 10, 11, 20, 21, 30, 31);
    SET(&ip, idx, 3, 0, 3, 1);
    SET(&ip, t1, 10, 20, 30, 40, 50);
    SET(&ip, i1, 4, 0, 4);
    SET(&ip, src, 1, 2, 3, 4, 5, 6, 7, 8);
    run_ok(&ip);
    EXPECT_DIMS(&ip, ga, 2, 2, 2);
    EXPECT(&ip, ga, 0, 30, 31, 0, 1, 30, 31, 10, 11);
    EXPECT(&ip, g1, 0, 50, 10, 50);
    /* row 3 gets src[0,0] + src[1,0]; row 2 is never indexed */
    EXPECT(&ip, sc, 0, 3, 4, 7, 8, 0, 0, 6, 8);
    interp_free(&ip);
    ir_graph_free(g);
}

Test(interp, gather_index_out_of_range)
{
    Graph *g = ir_graph_new("t");
    Loc loc = {ir_add_file(g, "model.kiln"), 14, 9};
    NodeId tab = input(g, "table", DT_F32, SH(256, 2));
    NodeId idx = input(g, "idx", DT_I64, SH(3));
    NodeId in[2] = {tab, idx};
    Shape s = SH(3, 2);
    ir_add_node(g, OP_GATHER, DT_F32, &s, in, 2, NULL, 0, loc);
    Interp ip;
    interp_init(&ip, g);
    interp_set(&ip, tab, (double[512]){0});
    SET(&ip, idx, 0, 300, 1);
    cr_assert_str_eq(run_err(&ip), "gather at node %2 (model.kiln:14:9): index 300 out of range [0, 256)");
    SET(&ip, idx, 0, -1, 1);
    cr_assert_str_eq(run_err(&ip), "gather at node %2 (model.kiln:14:9): index -1 out of range [0, 256)");
    SET(&ip, idx, 255, 0, 1);
    run_ok(&ip); /* the error message is cleared by a successful run */
    cr_assert_eq(ip.err.data ? strlen(ip.err.data) : 0, 0);
    interp_free(&ip);
    ir_graph_free(g);
}

Test(interp, scatter_add_index_out_of_range)
{
    Graph *g = ir_graph_new("t");
    NodeId idx = input(g, "idx", DT_I32, SH(2));
    NodeId src = input(g, "src", DT_F32, SH(2));
    bin(g, OP_SCATTER_ADD, DT_F32, SH(4), idx, src);
    Interp ip;
    interp_init(&ip, g);
    SET(&ip, idx, 1, 4);
    SET(&ip, src, 1, 1);
    cr_assert_str_eq(run_err(&ip), "scatter_add at node %2: index 4 out of range [0, 4)");
    interp_free(&ip);
    ir_graph_free(g);
}

/* ---- matmul ---- */

Test(interp, matmul_batched)
{
    Graph *g = ir_graph_new("t");
    NodeId x = input(g, "x", DT_F32, SH(2, 2, 3)), y = input(g, "y", DT_F32, SH(2, 3, 2));
    NodeId mm = bin(g, OP_MATMUL, DT_F32, SH(2, 2, 2), x, y);
    NodeId r = input(g, "r", DT_F32, SH(1, 3)), c = input(g, "c", DT_F32, SH(3, 1));
    NodeId dot = bin(g, OP_MATMUL, DT_F32, SH(1, 1), r, c);
    NodeId outer = bin(g, OP_MATMUL, DT_F32, SH(3, 3), c, r);
    NodeId p = input(g, "p", DT_F32, SH(1, 2)), q = input(g, "q", DT_F32, SH(2, 1));
    NodeId nan = bin(g, OP_MATMUL, DT_F32, SH(1, 1), p, q);
    NodeId b4x = input(g, "b4x", DT_F32, SH(2, 1, 1, 2)), b4y = input(g, "b4y", DT_F32, SH(2, 1, 2, 1));
    NodeId b4 = bin(g, OP_MATMUL, DT_F32, SH(2, 1, 1, 1), b4x, b4y);
    Interp ip;
    interp_init(&ip, g);
    SET(&ip, x, 1, 2, 3, 4, 5, 6, 1, 0, 0, 0, 1, 0);
    SET(&ip, y, 1, 0, 0, 1, 1, 1, 2, 3, 4, 5, 6, 7);
    SET(&ip, r, 1, 2, 3);
    SET(&ip, c, 4, 5, 6);
    SET(&ip, p, INFINITY, 1);
    SET(&ip, q, 0, 1);
    SET(&ip, b4x, 1, 2, 3, 4);
    SET(&ip, b4y, 5, 6, 7, 8);
    run_ok(&ip);
    /* [[1,2,3],[4,5,6]] @ [[1,0],[0,1],[1,1]] and [[1,0,0],[0,1,0]] @ [[2,3],[4,5],[6,7]] */
    EXPECT(&ip, mm, 0, 4, 5, 10, 11, 2, 3, 4, 5);
    EXPECT(&ip, dot, 0, 32);
    EXPECT(&ip, outer, 0, 4, 8, 12, 5, 10, 15, 6, 12, 18);
    EXPECT(&ip, nan, 0, NAN); /* inf * 0 is not skipped */
    EXPECT(&ip, b4, 0, 17, 53); /* 1*5 + 2*6, 3*7 + 4*8 */
    interp_free(&ip);
    ir_graph_free(g);
}

Test(interp, matmul_large_is_fast)
{
    Graph *g = ir_graph_new("t");
    NodeId x = cnst(g, 1, DT_F32, SH(128, 784)), y = cnst(g, 0.5, DT_F32, SH(784, 256));
    NodeId mm = bin(g, OP_MATMUL, DT_F32, SH(128, 256), x, y);
    Interp ip;
    interp_init(&ip, g);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    run_ok(&ip);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    const ITensor *t = interp_value(&ip, mm);
    for (int64_t i = 0; i < t->n; i++) cr_assert_eq(t->data[i], 392, "element %lld", (long long)i);
    /* ~0.05 s optimised; generous so that Debug and sanitizer builds pass too */
    cr_expect_lt(secs, 10.0, "matmul took %.2f s", secs);
    interp_free(&ip);
    ir_graph_free(g);
}

/* ---- unfold and fold ---- */

static NodeId window(Graph *g, Op op, Shape s, NodeId x, int kh, int kw, int sh, int sw, int dh, int dw)
{
    return una(g, op, DT_F32, s, x, (int64_t[]){kh, kw, sh, sw, dh, dw}, 6);
}

Test(interp, unfold_fold_stride2)
{
    Graph *g = ir_graph_new("t");
    NodeId x = input(g, "x", DT_F32, SH(1, 1, 4, 4));
    NodeId u = window(g, OP_UNFOLD, SH(1, 4, 4), x, 2, 2, 2, 2, 1, 1);
    NodeId f = window(g, OP_FOLD, SH(1, 1, 4, 4), u, 2, 2, 2, 2, 1, 1);
    Interp ip;
    interp_init(&ip, g);
    SET(&ip, x, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    run_ok(&ip);
    /* rows (i,j) = (0,0) (0,1) (1,0) (1,1); columns the 2x2 windows in row-major order */
    EXPECT(&ip, u, 0, 0, 2, 8, 10, 1, 3, 9, 11, 4, 6, 12, 14, 5, 7, 13, 15);
    /* non-overlapping windows: fold undoes unfold */
    EXPECT(&ip, f, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    interp_free(&ip);
    ir_graph_free(g);
}

Test(interp, unfold_fold_stride1)
{
    Graph *g = ir_graph_new("t");
    NodeId x = input(g, "x", DT_F32, SH(1, 1, 4, 4));
    NodeId u = window(g, OP_UNFOLD, SH(1, 4, 9), x, 2, 2, 1, 1, 1, 1);
    NodeId ones = cnst(g, 1, DT_F32, SH(1, 4, 9));
    NodeId f = window(g, OP_FOLD, SH(1, 1, 4, 4), ones, 2, 2, 1, 1, 1, 1);
    NodeId ud = window(g, OP_UNFOLD, SH(1, 4, 4), x, 2, 2, 1, 1, 2, 2); /* dilation 2 */
    NodeId c = input(g, "c", DT_F32, SH(1, 2, 2, 2));
    NodeId uc = window(g, OP_UNFOLD, SH(1, 8, 1), c, 2, 2, 1, 1, 1, 1); /* channel-major rows */
    NodeId n2 = input(g, "n2", DT_F32, SH(2, 1, 2, 3));
    NodeId un2 = window(g, OP_UNFOLD, SH(2, 2, 2), n2, 2, 1, 1, 2, 1, 1); /* 2x1 kernel, SW 2 */
    Interp ip;
    interp_init(&ip, g);
    SET(&ip, x, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    SET(&ip, c, 0, 1, 2, 3, 4, 5, 6, 7);
    SET(&ip, n2, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11);
    run_ok(&ip);
    EXPECT(&ip, u, 0, 0, 1, 2, 4, 5, 6, 8, 9, 10, /* (0,0) */
           1, 2, 3, 5, 6, 7, 9, 10, 11,             /* (0,1) */
           4, 5, 6, 8, 9, 10, 12, 13, 14,           /* (1,0) */
           5, 6, 7, 9, 10, 11, 13, 14, 15);         /* (1,1) */
    /* how many 2x2 windows cover each pixel */
    EXPECT(&ip, f, 0, 1, 2, 2, 1, 2, 4, 4, 2, 2, 4, 4, 2, 1, 2, 2, 1);
    EXPECT(&ip, ud, 0, 0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15);
    EXPECT(&ip, uc, 0, 0, 1, 2, 3, 4, 5, 6, 7);
    /* image n: [[a,b,c],[d,e,f]]; OH = 1, OW = 2 (columns 0 and 2) */
    EXPECT(&ip, un2, 0, 0, 2, 3, 5, 6, 8, 9, 11);
    interp_free(&ip);
    ir_graph_free(g);
}

static double dot_product(const ITensor *a, const ITensor *b)
{
    cr_assert_eq(a->n, b->n);
    double s = 0;
    for (int64_t i = 0; i < a->n; i++) s += a->data[i] * b->data[i];
    return s;
}

static void fill_random(Interp *ip, NodeId id, int64_t n, uint64_t stream)
{
    double *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = 2 * kiln_rng_uniform53(99, stream, 0, (uint64_t)i) - 1;
    interp_set(ip, id, v);
    free(v);
}

Test(interp, fold_is_adjoint_of_unfold)
{
    /* 3x2 kernel, stride (2, 1), dilation (1, 2) on 8x6: OH = (8-2-1)/2+1 = 3 (one row
     * unused), OW = (6-2-1)/1+1 = 4; rows C*KH*KW = 18. */
    Graph *g = ir_graph_new("t");
    NodeId x = input(g, "x", DT_F64, SH(2, 3, 8, 6));
    NodeId y = input(g, "y", DT_F64, SH(2, 18, 12));
    NodeId u = window(g, OP_UNFOLD, SH(2, 18, 12), x, 3, 2, 2, 1, 1, 2);
    NodeId f = window(g, OP_FOLD, SH(2, 3, 8, 6), y, 3, 2, 2, 1, 1, 2);
    Interp ip;
    interp_init(&ip, g);
    fill_random(&ip, x, 2 * 3 * 8 * 6, 1);
    fill_random(&ip, y, 2 * 18 * 12, 2);
    run_ok(&ip);
    double lhs = dot_product(interp_value(&ip, u), interp_value(&ip, y));
    double rhs = dot_product(interp_value(&ip, x), interp_value(&ip, f));
    cr_assert(fabs(lhs) > 1e-3, "degenerate test");
    cr_assert_float_eq(lhs, rhs, 1e-12 * fmax(1, fabs(lhs)), "<unfold x, y> = %.17g, <x, fold y> = %.17g", lhs, rhs);
    /* the unused last image row receives nothing from fold */
    const ITensor *ft = interp_value(&ip, f);
    for (int w = 0; w < 6; w++) cr_assert_eq(ft->data[7 * 6 + w], 0);
    interp_free(&ip);
    ir_graph_free(g);
}

/* ---- randomness ---- */

Test(interp, random_uniform)
{
    Graph *g = ir_graph_new("t");
    NodeId r7 = node(g, OP_RANDOM_UNIFORM, DT_F32, SH(1000), NULL, 0, (int64_t[]){7}, 1);
    NodeId r7b = node(g, OP_RANDOM_UNIFORM, DT_F32, SH(1000), NULL, 0, (int64_t[]){7}, 1);
    NodeId r8 = node(g, OP_RANDOM_UNIFORM, DT_F32, SH(1000), NULL, 0, (int64_t[]){8}, 1);
    Interp a, b;
    interp_init(&a, g);
    interp_init(&b, g);
    a.seed = b.seed = 42;
    a.step = b.step = 3;
    run_ok(&a);
    run_ok(&b);
    const double *va = interp_value(&a, r7)->data;
    double first[1000], sum = 0;
    memcpy(first, va, sizeof first);
    int differ8 = 0;
    for (int i = 0; i < 1000; i++) {
        cr_assert(va[i] >= 0 && va[i] < 1, "value %g outside [0, 1)", va[i]);
        cr_assert_eq(va[i] * 16777216.0, floor(va[i] * 16777216.0), "24-bit values");
        cr_assert_eq(va[i], interp_value(&b, r7)->data[i], "same seed/step/stream, other interpreter");
        cr_assert_eq(va[i], interp_value(&a, r7b)->data[i], "same stream, other node");
        differ8 += va[i] != interp_value(&a, r8)->data[i];
        sum += va[i];
    }
    cr_assert_gt(differ8, 990, "another stream gives other values");
    cr_assert_float_eq(sum / 1000, 0.5, 0.05);
    cr_assert_eq(va[5], (double)kiln_rng_uniform24(42, 3, 7, 5), "the contract of ops.h");
    run_ok(&a);
    for (int i = 0; i < 1000; i++) cr_assert_eq(interp_value(&a, r7)->data[i], first[i], "rerun is deterministic");
    a.step = 4;
    run_ok(&a);
    int differ = 0;
    for (int i = 0; i < 1000; i++) differ += interp_value(&a, r7)->data[i] != first[i];
    cr_assert_gt(differ, 990, "another step gives other values");
    interp_free(&a);
    interp_free(&b);
    ir_graph_free(g);
}

static void moments(const ITensor *t, double *mean, double *sd, double *lo, double *hi)
{
    double s = 0, s2 = 0;
    *lo = INFINITY, *hi = -INFINITY;
    for (int64_t i = 0; i < t->n; i++) {
        s += t->data[i];
        *lo = fmin(*lo, t->data[i]);
        *hi = fmax(*hi, t->data[i]);
    }
    *mean = s / (double)t->n;
    for (int64_t i = 0; i < t->n; i++) s2 += (t->data[i] - *mean) * (t->data[i] - *mean);
    *sd = sqrt(s2 / (double)t->n);
}

Test(interp, init_params_distributions)
{
    Graph *g = ir_graph_new("t");
    NodeId wu = param(g, "fc1.weight", SH(256, 784), INIT_UNIFORM, -0.1, 0.3);
    NodeId wn = param(g, "fc2.weight", SH(256, 784), INIT_NORMAL, 1.0, 2.0);
    NodeId z = param(g, "bn.running_mean", SH(3), INIT_ZEROS, 0, 0);
    NodeId o = param(g, "bn.running_var", SH(3), INIT_ONES, 0, 0);
    NodeId c = param(g, "scale", SH(2), INIT_CONSTANT, 0.25, 0);
    NodeId pre = param(g, "preset", SH(2), INIT_ONES, 0, 0);
    Interp ip;
    interp_init(&ip, g);
    SET(&ip, pre, 5, 6);
    interp_init_params(&ip, 1234);
    run_ok(&ip);
    double mean, sd, lo, hi;
    /* uniform(-0.1, 0.3): mean 0.1, sd 0.4/sqrt(12) = 0.11547; 200704 samples */
    moments(interp_value(&ip, wu), &mean, &sd, &lo, &hi);
    cr_assert_float_eq(mean, 0.1, 0.002, "uniform mean %g", mean);
    cr_assert_float_eq(sd, 0.11547, 0.002, "uniform sd %g", sd);
    cr_assert(lo >= -0.1 && hi < 0.3 && lo < -0.099 && hi > 0.299, "uniform range [%g, %g]", lo, hi);
    /* normal(1, 2) */
    const ITensor *tn = interp_value(&ip, wn);
    moments(tn, &mean, &sd, &lo, &hi);
    cr_assert_float_eq(mean, 1.0, 0.03, "normal mean %g", mean);
    cr_assert_float_eq(sd, 2.0, 0.03, "normal sd %g", sd);
    int64_t within = 0;
    for (int64_t i = 0; i < tn->n; i++) within += fabs(tn->data[i] - 1.0) < 2.0;
    cr_assert_float_eq((double)within / (double)tn->n, 0.6827, 0.01, "mass within one sd");
    EXPECT(&ip, z, 0, 0, 0, 0);
    EXPECT(&ip, o, 0, 1, 1, 1);
    EXPECT(&ip, c, 0, 0.25, 0.25);
    EXPECT(&ip, pre, 0, 5, 6); /* a param with a value is left alone */
    interp_free(&ip);
    ir_graph_free(g);
}

Test(interp, init_params_deterministic_and_order_independent)
{
    Graph *g1 = ir_graph_new("a");
    NodeId a1 = param(g1, "layer.w", SH(4, 5), INIT_NORMAL, 0, 1);
    NodeId b1 = param(g1, "layer.b", SH(5), INIT_UNIFORM, -1, 1);
    Graph *g2 = ir_graph_new("b"); /* other order, an extra param in front */
    param(g2, "other", SH(7), INIT_NORMAL, 0, 1);
    NodeId b2 = param(g2, "layer.b", SH(5), INIT_UNIFORM, -1, 1);
    NodeId a2 = param(g2, "layer.w", SH(4, 5), INIT_NORMAL, 0, 1);
    Interp i1, i2, i3, i4;
    interp_init(&i1, g1);
    interp_init(&i2, g2);
    interp_init(&i3, g1);
    interp_init(&i4, g1);
    interp_init_params(&i1, 7);
    interp_init_params(&i2, 7);
    interp_init_params(&i3, 7);
    interp_init_params(&i4, 8);
    const ITensor *ta1 = interp_value(&i1, a1), *ta2 = interp_value(&i2, a2), *ta3 = interp_value(&i3, a1);
    const ITensor *tb1 = interp_value(&i1, b1), *tb2 = interp_value(&i2, b2), *ta4 = interp_value(&i4, a1);
    int differ = 0;
    for (int i = 0; i < 20; i++) {
        cr_assert_eq(ta1->data[i], ta3->data[i], "two interpreters, same seed");
        cr_assert_eq(ta1->data[i], ta2->data[i], "node order does not matter");
        differ += ta1->data[i] != ta4->data[i];
    }
    for (int i = 0; i < 5; i++) cr_assert_eq(tb1->data[i], tb2->data[i]);
    cr_assert_eq(differ, 20, "another seed gives other values");
    cr_assert_neq(ta1->data[0], ta1->data[1]);
    interp_free(&i1);
    interp_free(&i2);
    interp_free(&i3);
    interp_free(&i4);
    ir_graph_free(g1);
    ir_graph_free(g2);
}

/* ---- errors and symbols ---- */

Test(interp, missing_input_and_param)
{
    Graph *g = ir_graph_new("t");
    NodeId x = input(g, "image", DT_F32, SH(2));
    NodeId w = param(g, "fc.weight", SH(2), INIT_ONES, 0, 0);
    NodeId s = bin(g, OP_ADD, DT_F32, SH(2), x, w);
    Interp ip;
    interp_init(&ip, g);
    cr_assert_str_eq(run_err(&ip), "input 'image' has no value");
    SET(&ip, x, 1, 2);
    cr_assert_str_eq(run_err(&ip), "param 'fc.weight' has no value");
    interp_init_params(&ip, 0);
    run_ok(&ip);
    EXPECT(&ip, s, 0, 2, 3);
    interp_set(&ip, x, NULL); /* clears the value */
    cr_assert_str_eq(run_err(&ip), "input 'image' has no value");
    cr_assert_null(interp_value(&ip, s)->data, "values after the failure are not computed");
    interp_free(&ip);
    ir_graph_free(g);
}

Test(interp, symbolic_dims)
{
    Graph *g = ir_graph_new("t");
    int B = ir_add_symbol(g, "B", 4);
    Shape sx = ir_shape_make(2, (Dim[]){ir_dim_sym(B), ir_dim_const(3)});
    NodeId x = input(g, "x", DT_F64, sx);
    NodeId rl = un(g, OP_RELU, DT_F64, sx, x);
    NodeId sum = una(g, OP_REDUCE_SUM, DT_F64, SH(1, 3), x, (int64_t[]){1}, 1);
    Shape sflat = ir_shape_make(1, (Dim[]){symdim(3, B)});
    NodeId flat = un(g, OP_RESHAPE, DT_F64, sflat, x);
    NodeId w = input(g, "w", DT_F64, SH(3, 1));
    Shape smm = ir_shape_make(2, (Dim[]){ir_dim_sym(B), ir_dim_const(1)});
    NodeId mm = bin(g, OP_MATMUL, DT_F64, smm, x, w);
    Interp ip;
    interp_init(&ip, g);
    cr_assert_eq(ip.symvals[B], 4, "symbols start at their max");
    cr_assert_eq(interp_set_symbol(&ip, "B", 5), -1, "above the max");
    cr_assert_eq(interp_set_symbol(&ip, "C", 1), -1, "unknown");
    cr_assert_eq(interp_set_symbol(&ip, "B", -1), -1, "negative");
    cr_assert_eq(interp_set_symbol(&ip, "B", 2), 0);
    SET(&ip, x, 1, -2, 3, 4, 5, -6);
    SET(&ip, w, 1, 10, 100);
    run_ok(&ip);
    EXPECT_DIMS(&ip, rl, 2, 3);
    EXPECT(&ip, rl, 0, 1, 0, 3, 4, 5, 0);
    EXPECT(&ip, sum, 0, 5, 3, -3);
    EXPECT_DIMS(&ip, flat, 6);
    EXPECT(&ip, mm, 0, 281, -546); /* 1 - 20 + 300, 4 + 50 - 600 */
    cr_assert_eq(interp_set_symbol(&ip, "B", 3), 0);
    cr_assert_str_eq(run_err(&ip),
                     "input 'x' was set with shape [2, 3] but has shape [3, 3] at the current symbol values; set it again");
    SET(&ip, x, 1, 2, 3, 4, 5, 6, 7, 8, 9);
    run_ok(&ip);
    EXPECT(&ip, sum, 0, 12, 15, 18);
    EXPECT_DIMS(&ip, flat, 9);
    cr_assert_eq(interp_set_symbol(&ip, "B", 0), 0); /* an empty batch is valid */
    SET(&ip, x, 0);
    run_ok(&ip);
    EXPECT(&ip, sum, 0, 0, 0, 0);
    cr_assert_eq(interp_value(&ip, mm)->n, 0);
    interp_free(&ip);
    ir_graph_free(g);
}

Test(interp, invalid_shapes)
{
    Graph *g = ir_graph_new("t");
    cnst(g, 1, DT_F32, SH(-1, 2));
    Interp ip;
    interp_init(&ip, g);
    cr_assert(strstr(run_err(&ip), "const at node %0: shape [-1, 2] is negative"));
    interp_free(&ip);
    ir_graph_free(g);

    g = ir_graph_new("t");
    cnst(g, 1, DT_F32, SH(INT64_C(1) << 21, INT64_C(1) << 20)); /* 2^41 elements */
    interp_init(&ip, g);
    cr_assert(strstr(run_err(&ip), "more than 2^40 elements"));
    interp_free(&ip);
    ir_graph_free(g);

    g = ir_graph_new("t");
    int T = ir_add_symbol(g, "T", INT64_C(1) << 30);
    cnst(g, 1, DT_F32, ir_shape_make(2, (Dim[]){ir_dim_sym(T), ir_dim_sym(T)}));
    interp_init(&ip, g);
    cr_assert(strstr(run_err(&ip), "shape [T, T] is negative or has more than 2^40 elements"));
    cr_assert_eq(interp_set_symbol(&ip, "T", 3), 0);
    run_ok(&ip);
    cr_assert_eq(interp_value(&ip, 0)->n, 9);
    interp_free(&ip);
    ir_graph_free(g);
}

/* Graphs the verifier would reject must still give an error, never a crash. */
Test(interp, malformed_graphs_are_errors)
{
    struct {
        Op op;
        Shape in, out;
        int64_t attrs[6];
        int nattrs;
        const char *msg;
    } cases[] = {
        {OP_PERMUTE, SH(2, 2), SH(2, 2), {0, 0}, 2, "not a permutation"},
        {OP_PERMUTE, SH(2, 3), SH(3, 2), {1}, 1, "too few attributes"},
        {OP_SLICE, SH(4), SH(4), {0, 1, IR_SLICE_END, 1}, 4, "does not match the slice"},
        {OP_SLICE, SH(4), SH(4), {0, 0, 4, 0}, 4, "unsupported slice"},
        {OP_SLICE, SH(4), SH(4), {3, 0, 4, 1}, 4, "out of range"},
        {OP_REDUCE_SUM, SH(4), SH(1), {2}, 1, "do not fit rank"},
        {OP_ARGMAX, SH(4), SH(1), {1}, 1, "out of range"},
        {OP_EXPAND, SH(2), SH(3), {0}, 0, "neither 1 nor"},
        {OP_RESHAPE, SH(2), SH(3), {0}, 0, "element counts differ"},
        {OP_RELU, SH(2), SH(3), {0}, 0, "does not have the output's shape"},
        {OP_UNFOLD, SH(1, 1, 4, 4), SH(1, 4, 5), {2, 2, 1, 1, 1, 1}, 6, "should be [1, 4, 9]"},
        {OP_UNFOLD, SH(1, 1, 4, 4), SH(1, 4, 9), {2, 2, 0, 1, 1, 1}, 6, "window attrs"},
        {OP_FOLD, SH(1, 4, 9), SH(1, 1, 4), {2, 2, 1, 1, 1, 1}, 6, "expects"},
        {OP_PAD, SH(2), SH(5), {1, 1}, 2, "does not match the padding"},
        {OP_IOTA, SH(2), SH(2), {3}, 1, "out of range"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        Graph *g = ir_graph_new("t");
        NodeId x = cnst(g, 1, DT_F32, cases[k].in);
        if (cases[k].op == OP_IOTA) node(g, OP_IOTA, DT_F32, cases[k].out, NULL, 0, cases[k].attrs, 1);
        else una(g, cases[k].op, DT_F32, cases[k].out, x, cases[k].attrs, cases[k].nattrs);
        Interp ip;
        interp_init(&ip, g);
        const char *err = run_err(&ip);
        cr_assert(strstr(err, cases[k].msg), "case %zu: '%s' lacks '%s'", k, err, cases[k].msg);
        interp_free(&ip);
        ir_graph_free(g);
    }
    /* operand that is not an earlier node, wrong arity */
    Graph *g = ir_graph_new("t");
    cnst(g, 1, DT_F32, SH(2));
    un(g, OP_NEG, DT_F32, SH(2), 5);
    Interp ip;
    interp_init(&ip, g);
    cr_assert(strstr(run_err(&ip), "is not an earlier node"));
    interp_free(&ip);
    ir_graph_free(g);
    g = ir_graph_new("t");
    NodeId c = cnst(g, 1, DT_F32, SH(2));
    un(g, OP_ADD, DT_F32, SH(2), c);
    interp_init(&ip, g);
    cr_assert(strstr(run_err(&ip), "wrong number of operands"));
    interp_free(&ip);
    ir_graph_free(g);
}
