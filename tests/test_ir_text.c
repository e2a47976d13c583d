/* test_ir_text.c — the IR's text form (print.c, read.c), its verifier (verify.c) and the
 * DOT printer (dot.c).
 *
 * Graphs are built directly with ir_add_node rather than through the checked builder, so
 * that these tests pin down the text form and the verifier on their own and can build
 * exactly the invalid graphs the verifier must reject. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../ir/ir.h"
#include "support.h"

#define D(k) ir_dim_const(k)
#define SY(s) ir_dim_sym(s)
#define SH(...) ir_shape_make((int)(sizeof((Dim[]){__VA_ARGS__}) / sizeof(Dim)), (Dim[]){__VA_ARGS__})
#define IN(...) (NodeId[]){__VA_ARGS__}, (int)(sizeof((NodeId[]){__VA_ARGS__}) / sizeof(NodeId))
#define AT(...) (int64_t[]){__VA_ARGS__}, (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t))
#define NO_IN NULL, 0
#define NO_AT NULL, 0

static const Shape SCALAR;
static const Loc NOLOC;

static NodeId nd(Graph *g, Op op, DType t, Shape s, const NodeId *in, int nin, const int64_t *a, int na)
{
    return ir_add_node(g, op, t, &s, in, nin, a, na, NOLOC);
}

static NodeId input(Graph *g, const char *name, DType t, Shape s)
{
    NodeId id = nd(g, OP_INPUT, t, s, NO_IN, NO_AT);
    ir_set_name(g, id, name);
    return id;
}

static NodeId param(Graph *g, const char *name, DType t, Shape s, InitKind k, double a0, double a1, bool trainable)
{
    NodeId id = nd(g, OP_PARAM, t, s, NO_IN, AT(k, trainable));
    ir_set_name(g, id, name);
    g->nodes[id].fattr[0] = a0;
    g->nodes[id].fattr[1] = a1;
    return id;
}

static NodeId cnst(Graph *g, double v, DType t)
{
    NodeId id = nd(g, OP_CONST, t, SCALAR, NO_IN, NO_AT);
    g->nodes[id].fattr[0] = v;
    return id;
}

static void at(Graph *g, NodeId id, uint16_t file, uint32_t line, uint32_t col)
{
    g->nodes[id].loc = (Loc){file, line, col};
}

static char *print_graph(const Graph *g)
{
    StrBuf b;
    sb_init(&b);
    ir_print(g, &b);
    return sb_take(&b);
}

/* A valid graph that uses every op and every dtype, symbolic and product dims, odd
 * names and paths, checkpoint regions, every output kind and awkward constants. */
static Graph *everything(void)
{
    Graph *g = ir_graph_new("mlp");
    int B = ir_add_symbol(g, "B", 128), T = ir_add_symbol(g, "T", 64);
    int Q = ir_add_symbol(g, "odd sym*", 4);
    ir_add_file(g, "models/mlp.kiln");
    ir_add_file(g, "dir with space/a:b.kiln");
    ir_add_file(g, "#hash\"quote\\.kiln");
    NodeId img = input(g, "image", DT_U8, SH(SY(B), D(4), D(4)));
    at(g, img, 0, 9, 9);
    NodeId x = nd(g, OP_CAST, DT_F32, SH(SY(B), D(4), D(4)), IN(img), NO_AT);
    ir_set_name(g, x, "x");
    at(g, x, 1, 10, 3);
    NodeId w = param(g, "fc1.weight", DT_F32, SH(D(16), D(8)), INIT_UNIFORM, -0.0357, 0.0357, true);
    at(g, w, 2, 4, 7);
    NodeId rm = param(g, "bn.running_mean", DT_F32, SH(D(8)), INIT_ZEROS, 0, 0, false);
    param(g, "c", DT_F64, SH(D(3)), INIT_CONSTANT, 0.25, 0, true);
    param(g, "n", DT_BF16, SH(D(2)), INIT_NORMAL, 0.0, 0.02, true);
    param(g, "weird \"name\"\\ \t\x01\x7f\xc3\xa9\n", DT_F16, SH(D(2)), INIT_ONES, 0, 0, true);
    NodeId c255 = cnst(g, 255.0, DT_F32);
    cnst(g, INFINITY, DT_F32);
    cnst(g, -INFINITY, DT_F64);
    cnst(g, NAN, DT_F32);
    cnst(g, -0.0, DT_F32);
    cnst(g, 5e-324, DT_F64);
    cnst(g, 0.1, DT_F64);
    cnst(g, -3.0, DT_I64);
    nd(g, OP_IOTA, DT_I32, SH(D(4), D(5)), NO_IN, AT(1));
    NodeId ru = nd(g, OP_RANDOM_UNIFORM, DT_F32, SH(SY(B), D(8)), NO_IN, AT(3));
    nd(g, OP_LOSS_SCALE, DT_F32, SCALAR, NO_IN, NO_AT);
    g->nodes[ru].ckpt = 2;
    NodeId flat = nd(g, OP_RESHAPE, DT_F32, SH(SY(B), D(16)), IN(x), NO_AT);
    g->nodes[flat].ckpt = 1;
    at(g, flat, 7, 1, 1); /* a file index the graph's file table lacks */
    NodeId h = nd(g, OP_MATMUL, DT_F32, SH(SY(B), D(8)), IN(flat, w), NO_AT);
    ir_set_name(g, h, "h with \"quotes\"");
    Shape bh = SH(SY(B), D(8));
    static const Op unary[] = {OP_NEG, OP_ABS, OP_SIGN, OP_EXP, OP_LOG, OP_SQRT, OP_TANH, OP_SIGMOID, OP_RELU,
                                OP_ERF, OP_SIN, OP_COS, OP_FLOOR};
    for (size_t i = 0; i < sizeof unary / sizeof *unary; i++) nd(g, unary[i], DT_F32, bh, IN(h), NO_AT);
    NodeId one = nd(g, OP_RESHAPE, DT_F32, SH(D(1), D(1)), IN(c255), NO_AT);
    NodeId big = nd(g, OP_EXPAND, DT_F32, bh, IN(one), NO_AT);
    static const Op binary[] = {OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_MAX, OP_MIN, OP_POW};
    for (size_t i = 0; i < sizeof binary / sizeof *binary; i++) nd(g, binary[i], DT_F32, bh, IN(h, big), NO_AT);
    static const Op cmp[] = {OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE};
    NodeId c = -1;
    for (size_t i = 0; i < sizeof cmp / sizeof *cmp; i++) c = nd(g, cmp[i], DT_BOOL, bh, IN(h, big), NO_AT);
    NodeId c2 = nd(g, OP_AND, DT_BOOL, bh, IN(c, c), NO_AT);
    c2 = nd(g, OP_OR, DT_BOOL, bh, IN(c2, c), NO_AT);
    c2 = nd(g, OP_NOT, DT_BOOL, bh, IN(c2), NO_AT);
    nd(g, OP_ROUND_STOCHASTIC, DT_BF16, bh, IN(h, ru), NO_AT);
    NodeId wh = nd(g, OP_WHERE, DT_F32, bh, IN(c2, h, big), NO_AT);
    NodeId logits = nd(g, OP_REDUCE_SUM, DT_F32, SH(SY(B), D(1)), IN(wh), AT(2));
    NodeId mx = nd(g, OP_REDUCE_MAX, DT_F32, SH(D(1), D(1)), IN(wh), AT(3));
    nd(g, OP_REDUCE_MAX, DT_F32, SH(SY(B), D(1)), IN(wh), AT(2, 1)); /* `first` */
    NodeId loss = nd(g, OP_RESHAPE, DT_F32, SCALAR, IN(mx), NO_AT);
    NodeId am = nd(g, OP_ARGMAX, DT_I64, SH(SY(B), D(1)), IN(h), AT(1));
    NodeId acc = nd(g, OP_CAST, DT_F64, SH(SY(B), D(1)), IN(am), NO_AT);
    nd(g, OP_PERMUTE, DT_F32, SH(D(8), SY(B)), IN(h), AT(1, 0));
    NodeId sl = nd(g, OP_SLICE, DT_F32, SH(SY(B), D(3)), IN(h), AT(1, 2, 7, 2));
    nd(g, OP_SLICE, DT_F32, bh, IN(h), AT(0, 0, IR_SLICE_END, 1));
    nd(g, OP_CONCAT, DT_F32, SH(SY(B), D(6)), IN(sl, sl), AT(1));
    Dim twob;
    ir_dim_mul(D(2), SY(B), &twob);
    nd(g, OP_CONCAT, DT_F32, SH(twob, D(8)), IN(h, h), AT(0));
    NodeId pd = nd(g, OP_PAD, DT_F32, SH(SY(B), D(11)), IN(h), AT(0, 1, 0, 2));
    g->nodes[pd].fattr[0] = -1.5;
    NodeId tok = input(g, "tokens", DT_I32, SH(SY(B), SY(T)));
    NodeId ck = nd(g, OP_CHECK_INDEX, DT_I32, SH(SY(B), SY(T)), IN(tok), AT(16));
    ir_set_name(g, ck, "Embedding 'wte'");
    NodeId emb = nd(g, OP_GATHER, DT_F32, SH(SY(B), SY(T), D(8)), IN(w, ck), NO_AT);
    Dim bt;
    ir_dim_mul(SY(B), SY(T), &bt);
    Dim qbt;
    ir_dim_mul(bt, SY(Q), &qbt);
    ir_dim_mul(qbt, D(4), &qbt);
    nd(g, OP_RESHAPE, DT_F32, SH(bt, D(8)), IN(emb), NO_AT);
    NodeId q = input(g, "q", DT_F32, SH(qbt));
    nd(g, OP_NEG, DT_F32, SH(qbt), IN(q), NO_AT);
    nd(g, OP_SCATTER_ADD, DT_F32, SH(D(16), D(8)), IN(tok, emb), NO_AT);
    NodeId im = input(g, "im", DT_F32, SH(SY(B), D(3), D(8), D(8)));
    NodeId cols = nd(g, OP_UNFOLD, DT_F32, SH(SY(B), D(27), D(36)), IN(im), AT(3, 3, 1, 1, 1, 1));
    nd(g, OP_FOLD, DT_F32, SH(SY(B), D(3), D(8), D(8)), IN(cols), AT(3, 3, 1, 1, 1, 1));
    nd(g, OP_DETACH, DT_F32, SH(SY(B), D(3), D(8), D(8)), IN(im), NO_AT);
    /* fused attention: 4 query heads over 2 key/value heads, a bool mask, dropout */
    NodeId aq = input(g, "aq", DT_F32, SH(SY(B), D(4), SY(T), D(8))), ak = input(g, "ak", DT_F32, SH(SY(B), D(2), SY(T), D(8)));
    NodeId amask = input(g, "am", DT_BOOL, SH(SY(B), D(4), SY(T), SY(T)));
    NodeId ao = nd(g, OP_ATTENTION, DT_F32, SH(SY(B), D(4), SY(T), D(8)), IN(aq, ak, ak, amask), AT(ATTN_MASK_KEEP, 3));
    NodeId al = nd(g, OP_ATTENTION_LSE, DT_F32, SH(SY(B), D(4), SY(T), D(1)), IN(aq, ak, ak, amask), AT(ATTN_MASK_KEEP, 3));
    NodeId ag = nd(g, OP_ATTENTION_GRAD, DT_F32, SH(SY(B), D(2), SY(T), D(8)), IN(aq, ak, ak, amask, ao, al, ao), AT(ATTN_MASK_KEEP, 3, 1));
    const NodeId attn[3] = {ao, al, ag};
    for (int i = 0; i < 3; i++) g->nodes[attn[i]].fattr[0] = 0.125, g->nodes[attn[i]].fattr[1] = 0.25;
    ir_add_output(g, OUT_FORWARD, "logits", logits);
    ir_add_output(g, OUT_LOSS, "loss", loss);
    ir_add_output(g, OUT_METRIC, "accuracy", acc);
    ir_add_output(g, OUT_UPDATE, "bn.running_mean", rm);
    ir_add_output(g, OUT_GRAD, "fc1 weight:grad", w);
    return g;
}

static bool same_double(double a, double b) { return (isnan(a) && isnan(b)) || !memcmp(&a, &b, sizeof a); }

static void assert_same_graph(const Graph *a, const Graph *b)
{
    cr_assert_str_eq(a->name, b->name);
    cr_assert_eq(a->mode, b->mode);
    cr_assert_eq(a->nfiles, b->nfiles);
    for (int i = 0; i < a->nfiles; i++) cr_assert_str_eq(a->files[i], b->files[i]);
    cr_assert_eq(a->nsyms, b->nsyms);
    for (int i = 0; i < a->nsyms; i++) {
        cr_assert_str_eq(a->syms[i].name, b->syms[i].name);
        cr_assert_eq(a->syms[i].max, b->syms[i].max);
    }
    cr_assert_eq(a->nnodes, b->nnodes);
    for (NodeId i = 0; i < a->nnodes; i++) {
        const Node *x = &a->nodes[i], *y = &b->nodes[i];
        cr_assert_eq(x->op, y->op, "node %d", i);
        cr_assert_eq(x->dtype, y->dtype, "node %d", i);
        cr_assert_eq(x->ckpt, y->ckpt, "node %d", i);
        cr_assert(ir_shape_eq(&x->shape, &y->shape), "node %d", i);
        cr_assert_eq(x->ninputs, y->ninputs, "node %d", i);
        for (uint32_t j = 0; j < x->ninputs; j++) cr_assert_eq(ir_input(a, i, (int)j), ir_input(b, i, (int)j));
        cr_assert_eq(x->nattrs, y->nattrs, "node %d", i);
        for (uint32_t j = 0; j < x->nattrs; j++) cr_assert_eq(ir_attrs(a, i)[j], ir_attrs(b, i)[j]);
        cr_assert(same_double(x->fattr[0], y->fattr[0]) && same_double(x->fattr[1], y->fattr[1]), "node %d", i);
        cr_assert_str_eq(ir_node_name(a, i), ir_node_name(b, i));
        cr_assert_eq(x->loc.line, y->loc.line, "node %d", i);
        if (x->loc.line) cr_assert(x->loc.file == y->loc.file && x->loc.col == y->loc.col, "node %d", i);
    }
    cr_assert_eq(a->noutputs, b->noutputs);
    for (int i = 0; i < a->noutputs; i++) {
        cr_assert_eq(a->outputs[i].kind, b->outputs[i].kind);
        cr_assert_eq(a->outputs[i].node, b->outputs[i].node);
        cr_assert_str_eq(ir_str(a, a->outputs[i].name), ir_str(b, b->outputs[i].name));
    }
}

static void assert_valid(const Graph *g)
{
    StrBuf err;
    sb_init(&err);
    int n = ir_verify(g, &err);
    cr_assert_eq(n, 0, "verify found %d problems:\n%s", n, err.data ? err.data : "");
    sb_free(&err);
}

/* print -> read -> print must give the same bytes, and read must give the same graph. */
static void round_trip(const Graph *g)
{
    char *t1 = print_graph(g);
    Diag d;
    diag_init(&d, NULL);
    Graph *r = ir_read(t1, strlen(t1), "rt.ir", &d);
    cr_assert_not_null(r, "read failed:\n%s\ntext:\n%s", d.out.data ? d.out.data : "", t1);
    char *t2 = print_graph(r);
    cr_assert_str_eq(t1, t2);
    assert_same_graph(g, r);
    free(t1);
    free(t2);
    ir_graph_free(r);
    diag_free(&d);
}

Test(ir_text, everything_covers_every_op_and_dtype)
{
    Graph *g = everything();
    bool ops[OP_COUNT] = {false}, dts[DT_COUNT] = {false}, kinds[OUT_KIND_COUNT] = {false};
    for (NodeId i = 0; i < g->nnodes; i++) ops[g->nodes[i].op] = dts[g->nodes[i].dtype] = true;
    for (int i = 0; i < g->noutputs; i++) kinds[g->outputs[i].kind] = true;
    for (int i = 0; i < OP_COUNT; i++) cr_expect(ops[i], "op %s is not covered", ir_op_info[i].name);
    for (int i = 0; i < DT_COUNT; i++) cr_expect(dts[i], "dtype %s is not covered", ir_dtype_name((DType)i));
    for (int i = 0; i < OUT_KIND_COUNT; i++) cr_expect(kinds[i], "output kind %d is not covered", i);
    assert_valid(g);
    ir_graph_free(g);
}

Test(ir_text, round_trip_everything)
{
    Graph *g = everything();
    round_trip(g);
    g->mode = MODE_EVAL;
    free(g->name);
    g->name = xstrdup("a model: \"odd\"");
    round_trip(g);
    ir_graph_free(g);
}

Test(ir_text, round_trip_empty_graph)
{
    Graph *g = ir_graph_new("empty");
    round_trip(g);
    char *t = print_graph(g);
    cr_assert_str_eq(t, "kiln-ir 1\ngraph empty mode=train\n");
    free(t);
    ir_graph_free(g);
}

Test(ir_text, printing_is_deterministic)
{
    Graph *a = everything(), *b = everything();
    char *ta = print_graph(a), *tb = print_graph(b), *ta2 = print_graph(a);
    cr_assert_str_eq(ta, tb);
    cr_assert_str_eq(ta, ta2);
    free(ta), free(tb), free(ta2);
    ir_graph_free(a), ir_graph_free(b);
}

Test(ir_text, exact_text_of_a_small_graph)
{
    Graph *g = ir_graph_new("mlp");
    int B = ir_add_symbol(g, "B", 128);
    ir_add_file(g, "models/mlp.kiln");
    ir_add_file(g, "my dir/x.kiln");
    NodeId img = input(g, "image", DT_U8, SH(SY(B), D(28), D(28)));
    at(g, img, 0, 9, 9);
    NodeId w = param(g, "fc1.weight", DT_F32, SH(D(784), D(4)), INIT_UNIFORM, -0.0357, 0.0357, true);
    NodeId x = nd(g, OP_CAST, DT_F32, SH(SY(B), D(28), D(28)), IN(img), NO_AT);
    ir_set_name(g, x, "x");
    at(g, x, 1, 10, 9);
    g->nodes[x].ckpt = 3;
    NodeId f = nd(g, OP_RESHAPE, DT_F32, SH(SY(B), D(784)), IN(x), NO_AT);
    NodeId y = nd(g, OP_MATMUL, DT_F32, SH(SY(B), D(4)), IN(f, w), NO_AT);
    NodeId s = nd(g, OP_SLICE, DT_F32, SH(SY(B), D(2)), IN(y), AT(1, 2, IR_SLICE_END, 1));
    NodeId r = nd(g, OP_REDUCE_SUM, DT_F32, SH(SY(B), D(1)), IN(s), AT(1 << 1));
    NodeId k = cnst(g, 255.0, DT_F32);
    NodeId l = nd(g, OP_RESHAPE, DT_F32, SCALAR, IN(k), NO_AT);
    ir_add_output(g, OUT_FORWARD, "logits", r);
    ir_add_output(g, OUT_LOSS, "loss", l);
    char *t = print_graph(g);
    cr_assert_str_eq(t, "kiln-ir 1\n"
                        "graph mlp mode=train\n"
                        "file \"models/mlp.kiln\"\n"
                        "file \"my dir/x.kiln\"\n"
                        "sym B <= 128\n"
                        "%0 = input \"image\" : u8[B, 28, 28] @models/mlp.kiln:9:9\n"
                        "%1 = param \"fc1.weight\" init=uniform(-0.0357, 0.0357) trainable : f32[784, 4]\n"
                        "%2 = cast %0 : f32[B, 28, 28] \"x\" ckpt=3 @\"my dir/x.kiln\":10:9\n"
                        "%3 = reshape %2 : f32[B, 784]\n"
                        "%4 = matmul %3, %1 : f32[B, 4]\n"
                        "%5 = slice %4 axis=1 start=2 end=end step=1 : f32[B, 2]\n"
                        "%6 = reduce_sum %5 axes=[1] : f32[B, 1]\n"
                        "%7 = const 255.0 : f32[]\n"
                        "%8 = reshape %7 : f32[]\n"
                        "output logits = %6\n"
                        "loss loss = %8\n");
    round_trip(g);
    free(t);
    ir_graph_free(g);
}

Test(ir_text, reader_accepts_comments_blank_lines_crlf_and_spacing)
{
    const char *text = "# a hand-written graph\r\n"
                       "kiln-ir 1\r\n"
                       "\n"
                       "graph \"g\"   mode=eval\n"
                       "sym B <= 8\n"
                       "   # indented comment\n"
                       "%0 = input image : f32[ 2*B ,B*2]\n"
                       "%1 =  neg  %0   :  f32[2*B, 2*B]   \"y\"\n"
                       "output out = %1\n";
    Diag d;
    diag_init(&d, NULL);
    Graph *g = ir_read(text, strlen(text), "h.ir", &d);
    cr_assert_not_null(g, "%s", d.out.data);
    cr_assert_eq(g->mode, MODE_EVAL);
    cr_assert_str_eq(ir_node_name(g, 1), "y");
    char *t = print_graph(g);
    cr_assert_str_eq(t, "kiln-ir 1\ngraph g mode=eval\nsym B <= 8\n%0 = input \"image\" : f32[2*B, 2*B]\n"
                        "%1 = neg %0 : f32[2*B, 2*B] \"y\"\noutput out = %1\n");
    free(t);
    ir_graph_free(g);
    diag_free(&d);
}

/* The golden dumps of the reference models, written by the frontend's tests, must read
 * back and print identically: the printer and reader agree on real graphs too. */
Test(ir_text, golden_dumps_round_trip)
{
    static const char *const files[] = {"tests/golden/mlp.ir", "tests/golden/mlp.eval.ir", "tests/golden/cnn.ir",
                                        "tests/golden/gpt.ir"};
    int found = 0;
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        size_t len;
        char *text = support_read(files[i], &len);
        if (!text) continue;
        found++;
        Diag d;
        diag_init(&d, NULL);
        Graph *g = ir_read(text, len, files[i], &d);
        cr_assert_not_null(g, "%s", d.out.data);
        char *t = print_graph(g);
        cr_assert_str_eq(t, text, "%s does not print back identically", files[i]);
        free(t);
        free(text);
        ir_graph_free(g);
        diag_free(&d);
    }
    if (!found) cr_skip_test("no golden dumps yet");
}

/* ---- reader diagnostics ---- */

static const char *HEAD = "kiln-ir 1\ngraph g mode=train\n";

/* Reads HEAD + body (or the raw text when raw), expects failure, returns the first line. */
static void expect_read_error(const char *body, bool raw, const char *first_line)
{
    StrBuf t;
    sb_init(&t);
    if (!raw) sb_puts(&t, HEAD);
    sb_puts(&t, body);
    Diag d;
    diag_init(&d, NULL);
    Graph *g = ir_read(t.data ? t.data : "", t.len, "t.ir", &d);
    cr_assert_null(g, "read succeeded on:\n%s", t.data);
    cr_assert(d.nerrors >= 1);
    const char *out = d.out.data;
    const char *nl = strchr(out, '\n');
    size_t n = nl ? (size_t)(nl - out) : strlen(out);
    char *line = xstrndup(out, n);
    cr_assert_str_eq(line, first_line, "full diagnostics:\n%s", out);
    free(line);
    sb_free(&t);
    diag_free(&d);
}

Test(ir_read, empty_input) { expect_read_error("", true, "t.ir:1:1: error: missing the header 'kiln-ir 1'"); }

Test(ir_read, bad_header)
{
    expect_read_error("kiln 1\n", true, "t.ir:1:1: error: expected the header 'kiln-ir 1', found 'kiln'");
    expect_read_error("kiln-ir 2\ngraph g mode=train\n", true,
                      "t.ir:1:9: error: unsupported kiln-ir version 2 (this reader knows 1)");
    expect_read_error("kiln-ir 1\n", true, "t.ir:1:1: error: missing the 'graph NAME mode=...' line");
    expect_read_error("kiln-ir 1\ngraph g mode=fast\n", true,
                      "t.ir:2:14: error: expected 'train' or 'eval', found 'fast'");
}

Test(ir_read, unknown_op_suggests)
{
    expect_read_error("%0 = const 1.0 : f32[]\n%1 = addd %0, %0 : f32[]\n", false,
                      "t.ir:4:6: error: unknown op 'addd' (did you mean 'add'?)");
    expect_read_error("%0 = frobnicate : f32[]\n", false, "t.ir:3:6: error: unknown op 'frobnicate'");
}

Test(ir_read, missing_colon)
{
    expect_read_error("%0 = const 1.0 : f32[]\n%1 = add %0, %0 foo : f32[]\n", false,
                      "t.ir:4:17: error: expected ':' before the type, found 'foo'");
}

Test(ir_read, forward_reference)
{
    expect_read_error("%0 = const 1.0 : f32[]\n%1 = add %0, %12 : f32[]\n", false,
                      "t.ir:4:14: error: operand %12 is not defined before node %1");
    expect_read_error("%0 = neg %0 : f32[]\n", false, "t.ir:3:10: error: operand %0 is not defined before node %0");
}

Test(ir_read, unknown_dtype)
{
    expect_read_error("%0 = const 1.0 : f33[]\n", false, "t.ir:3:18: error: unknown dtype 'f33' (did you mean 'f32'?)");
}

Test(ir_read, unknown_symbol)
{
    expect_read_error("%0 = input \"x\" : f32[T, 3]\n", false,
                      "t.ir:3:22: error: unknown symbol 'T' in shape (declare it with 'sym T <= N')");
}

Test(ir_read, unterminated_string)
{
    expect_read_error("%0 = input \"x : f32[]\n", false, "t.ir:3:12: error: unterminated string");
    expect_read_error("%0 = input \"a\\qb\" : f32[]\n", false,
                      "t.ir:3:14: error: invalid escape in string (use \\\", \\\\ or \\xNN)");
}

Test(ir_read, nodes_numbered_in_order)
{
    expect_read_error("%1 = const 1.0 : f32[]\n", false,
                      "t.ir:3:1: error: expected node %0 here (nodes are numbered in order), found %1");
}

Test(ir_read, unknown_statement_and_file)
{
    expect_read_error("%0 = const 1.0 : f32[]\noutptu x = %0\n", false,
                      "t.ir:4:1: error: unknown statement 'outptu' (did you mean 'output'?)");
    expect_read_error("%0 = const 1.0 : f32[] @a.kiln:1:2\n", false,
                      "t.ir:3:25: error: unknown file 'a.kiln' in location (declare it with a 'file' line)");
    expect_read_error("%0 = const 1.0 : f32[]\noutput x = %1\n", false,
                      "t.ir:4:12: error: output refers to %1, which is not defined");
}

Test(ir_read, param_syntax)
{
    expect_read_error("%0 = param \"w\" init=uniform(1.0) trainable : f32[2]\n", false,
                      "t.ir:3:21: error: init 'uniform' takes 2 arguments, got 1");
    expect_read_error("%0 = param \"w\" init=unifrom(1.0, 2.0) trainable : f32[2]\n", false,
                      "t.ir:3:21: error: unknown init kind 'unifrom' (did you mean 'uniform'?)");
    expect_read_error("%0 = param \"w\" init=zeros learnable : f32[2]\n", false,
                      "t.ir:3:27: error: expected 'trainable' or 'buffer', found 'learnable'");
}

Test(ir_read, verifier_problems_become_diagnostics)
{
    expect_read_error("%0 = const 1.0 : f32[4]\n%1 = const 1.0 : f32[3]\n%2 = add %0, %1 : f32[4]\n", false,
                      "t.ir:5:1: error: node %2 (add): operand shapes differ: [4] vs [3]");
    expect_read_error("%0 = const 1.0 : f32[4]\nloss l = %0\n", false,
                      "t.ir:4:1: error: loss 'l': must be a floating-point scalar, but %0 is f32[4]");
    expect_read_error("sym B <= 0\n", false, "t.ir:3:1: error: symbol 'B': bound 0 is not between 1 and 2^32");
    expect_read_error("%0 = add %0 : f32[]\n", false, "t.ir:3:10: error: operand %0 is not defined before node %0");
}

Test(ir_read, source_line_and_caret_are_shown)
{
    Diag d;
    diag_init(&d, NULL);
    const char *text = "kiln-ir 1\ngraph g mode=train\n%0 = const 1.0 : f33[]\n";
    cr_assert_null(ir_read(text, strlen(text), "t.ir", &d));
    cr_assert_str_eq(d.out.data, "t.ir:3:18: error: unknown dtype 'f33' (did you mean 'f32'?)\n"
                                 "    %0 = const 1.0 : f33[]\n"
                                 "                     ^\n");
    diag_free(&d);
}

/* Random and mutated inputs: the reader must reject or accept them without crashing or
 * leaking (the sanitizer build checks the memory side), and anything it accepts must print
 * back to text that reads again to the same text. */
Test(ir_read, survives_mutated_input)
{
    Graph *g = everything();
    char *base = print_graph(g);
    ir_graph_free(g);
    size_t blen = strlen(base);
    uint64_t s = 0x9e3779b97f4a7c15u;
    static const char *const snippets[] = {"%", "%99999999999", "\"", "\\x", "*B", "[", "]", ",", "@", ":",
                                           "\n", "-", "9223372036854775808", "nan", "end", "=", "#", "\r"};
    int accepted = 0;
    for (int iter = 0; iter < 3000; iter++) {
        StrBuf t;
        sb_init(&t);
        sb_putn(&t, base, blen);
        int nmut = 1 + (int)((s >> 7) % 4);
        for (int m = 0; m < nmut; m++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            size_t pos = (size_t)(s % (t.len + 1));
            switch ((s >> 40) % 5) {
            case 0: if (pos < t.len) t.data[pos] = (char)(s >> 24); break;
            case 1: if (pos < t.len) memmove(t.data + pos, t.data + pos + 1, t.len-- - pos); break;
            case 2: {
                const char *sn = snippets[(s >> 32) % (sizeof snippets / sizeof *snippets)];
                StrBuf u;
                sb_init(&u);
                sb_putn(&u, t.data, pos);
                sb_puts(&u, sn);
                sb_putn(&u, t.data + pos, t.len - pos);
                sb_free(&t);
                t = u;
                break;
            }
            case 3: t.len = pos, t.data[pos] = 0; break;
            default: if (pos < t.len) t.data[pos] = "0123456789%[]\":@*"[(s >> 20) % 17]; break;
            }
        }
        Diag d;
        diag_init(&d, NULL);
        Graph *r = ir_read(t.data, t.len, "fuzz.ir", &d);
        if (r) {
            accepted++;
            char *t1 = print_graph(r);
            Diag d2;
            diag_init(&d2, NULL);
            Graph *r2 = ir_read(t1, strlen(t1), "again.ir", &d2);
            cr_assert_not_null(r2, "accepted text printed to unreadable text:\n%s\n%s", t1, d2.out.data);
            char *t2 = print_graph(r2);
            cr_assert_str_eq(t1, t2);
            free(t1), free(t2);
            ir_graph_free(r2);
            diag_free(&d2);
            ir_graph_free(r);
        } else {
            cr_assert(d.nerrors > 0);
        }
        diag_free(&d);
        sb_free(&t);
    }
    cr_assert(accepted > 0, "no mutation was accepted: the fuzzer is not exercising the success path");
    free(base);
}

/* ---- verifier ---- */

static void expect_problem(Graph *g, const char *needle)
{
    StrBuf err;
    sb_init(&err);
    int n = ir_verify(g, &err);
    cr_assert(n > 0, "expected a problem containing \"%s\", verify found none", needle);
    cr_assert_not_null(strstr(err.data, needle), "expected \"%s\" in:\n%s", needle, err.data);
    /* Even a broken graph must print and draw without crashing. */
    StrBuf b;
    sb_init(&b);
    ir_print(g, &b);
    ir_print_dot(g, &b);
    sb_free(&b);
    sb_free(&err);
    ir_graph_free(g);
}

/* A fresh graph "t" holding one input "a". */
static Graph *with_a(NodeId *a, DType t, Shape s)
{
    Graph *g = ir_graph_new("t");
    *a = input(g, "a", t, s);
    return g;
}

static Graph *g_with_B(int *B)
{
    Graph *g = ir_graph_new("t");
    *B = ir_add_symbol(g, "B", 128);
    return g;
}

Test(verify, accepts_valid_graphs)
{
    Graph *g = everything();
    assert_valid(g);
    ir_graph_free(g);
    g = ir_graph_new("empty");
    assert_valid(g);
    ir_graph_free(g);
}

Test(verify, op_in_range)
{
    NodeId a;
    Graph *g = with_a(&a, DT_F32, SH(D(4)));
    g->nodes[a].op = 200;
    expect_problem(g, "node %0: unknown op 200");
}

Test(verify, arity)
{
    NodeId a;
    Graph *g = with_a(&a, DT_F32, SH(D(4)));
    nd(g, OP_ADD, DT_F32, SH(D(4)), IN(a), NO_AT);
    expect_problem(g, "node %1 (add): expects 2 operands, got 1");
    g = ir_graph_new("t");
    nd(g, OP_CONCAT, DT_F32, SH(D(4)), NO_IN, AT(0));
    expect_problem(g, "node %0 (concat): expects at least 1 operand, got 0");
}

Test(verify, operands_are_earlier_nodes)
{
    NodeId a;
    Graph *g = with_a(&a, DT_F32, SH(D(4)));
    nd(g, OP_NEG, DT_F32, SH(D(4)), IN(2), NO_AT);
    nd(g, OP_NEG, DT_F32, SH(D(4)), IN(a), NO_AT);
    expect_problem(g, "node %1 (neg): operand 0 is %2, which is not an earlier node");
    g = ir_graph_new("t");
    nd(g, OP_NEG, DT_F32, SH(D(4)), IN(-1), NO_AT);
    expect_problem(g, "node %0 (neg): operand 0 is %-1, which is not an earlier node");
}

Test(verify, attribute_counts)
{
    NodeId a;
    Graph *g = with_a(&a, DT_F32, SH(D(4), D(2)));
    nd(g, OP_REDUCE_SUM, DT_F32, SH(D(1), D(2)), IN(a), NO_AT);
    expect_problem(g, "node %1 (reduce_sum): expects 1 attribute, got 0");
    g = with_a(&a, DT_F32, SH(D(4), D(2)));
    nd(g, OP_PERMUTE, DT_F32, SH(D(2), D(4)), IN(a), AT(1));
    expect_problem(g, "node %1 (permute): expects 2 attributes, got 1");
    g = with_a(&a, DT_F32, SH(D(4), D(2)));
    nd(g, OP_PAD, DT_F32, SH(D(4), D(2)), IN(a), AT(0, 0));
    expect_problem(g, "node %1 (pad): expects 4 attributes, got 2");
    g = with_a(&a, DT_F32, SH(D(4)));
    nd(g, OP_NEG, DT_F32, SH(D(4)), IN(a), AT(7));
    expect_problem(g, "node %1 (neg): expects 0 attributes, got 1");
}

Test(verify, dtype_valid)
{
    NodeId a;
    Graph *g = with_a(&a, DT_F32, SH(D(4)));
    g->nodes[a].dtype = 42;
    expect_problem(g, "node %0 (input): invalid dtype 42");
}

Test(verify, rank_limit)
{
    NodeId a;
    Graph *g = with_a(&a, DT_F32, SH(D(4)));
    g->nodes[a].shape.rank = 9;
    expect_problem(g, "node %0 (input): rank 9 exceeds the maximum 8");
}

Test(verify, dims_valid)
{
    Graph *g = ir_graph_new("t");
    input(g, "a", DT_F32, SH(D(-2)));
    expect_problem(g, "node %0 (input): dim 0 is negative (-2)");
    g = ir_graph_new("t");
    input(g, "a", DT_F32, SH(D(2), SY(5)));
    expect_problem(g, "node %0 (input): dim 1 refers to undefined symbol $5");
    g = ir_graph_new("t");
    input(g, "a", DT_F32, SH(D(INT64_C(1) << 33)));
    expect_problem(g, "node %0 (input): dim 0 (8589934592) can exceed the largest dim 2^32");
}

Test(verify, element_count_limit)
{
    Graph *g = ir_graph_new("t");
    input(g, "a", DT_F32, SH(D(1 << 21), D(1 << 21)));
    expect_problem(g, "node %0 (input): [2097152, 2097152] can hold more than 2^40 elements");
}

Test(verify, unary_same_shape_and_dtype)
{
    NodeId a;
    Graph *g = with_a(&a, DT_F32, SH(D(4)));
    nd(g, OP_NEG, DT_F32, SH(D(3)), IN(a), NO_AT);
    expect_problem(g, "node %1 (neg): shape is [3], expected [4]");
    g = with_a(&a, DT_F32, SH(D(4)));
    nd(g, OP_RELU, DT_F64, SH(D(4)), IN(a), NO_AT);
    expect_problem(g, "node %1 (relu): dtype is f64, expected f32");
}

Test(verify, cast_keeps_shape_any_dtype)
{
    NodeId a;
    Graph *g = with_a(&a, DT_F32, SH(D(4)));
    nd(g, OP_CAST, DT_BOOL, SH(D(4)), IN(a), NO_AT);
    assert_valid(g);
    nd(g, OP_CAST, DT_I32, SH(D(2), D(2)), IN(a), NO_AT);
    expect_problem(g, "node %2 (cast): shape is [2, 2], expected [4]");
}

Test(verify, float_ops_need_float)
{
    NodeId a;
    Graph *g = with_a(&a, DT_I32, SH(D(4)));
    nd(g, OP_EXP, DT_I32, SH(D(4)), IN(a), NO_AT);
    expect_problem(g, "node %1 (exp): operand must be floating point, got i32");
}

Test(verify, logic_ops_need_bool)
{
    NodeId a;
    Graph *g = with_a(&a, DT_F32, SH(D(4)));
    nd(g, OP_NOT, DT_F32, SH(D(4)), IN(a), NO_AT);
    expect_problem(g, "node %1 (not): operand must be bool, got f32");
    g = with_a(&a, DT_I32, SH(D(4)));
    nd(g, OP_AND, DT_I32, SH(D(4)), IN(a, a), NO_AT);
    expect_problem(g, "node %1 (and): operand must be bool, got i32");
}

Test(verify, binary_identical_shapes)
{
    int B;
    Graph *g = g_with_B(&B);
    NodeId a = input(g, "a", DT_F32, SH(SY(B), D(256)));
    NodeId b = input(g, "b", DT_F32, SH(D(256)));
    nd(g, OP_ADD, DT_F32, SH(SY(B), D(256)), IN(a, b), NO_AT);
    expect_problem(g, "node %2 (add): operand shapes differ: [B, 256] vs [256]");
}

Test(verify, binary_identical_dtypes)
{
    NodeId a;
    Graph *g = with_a(&a, DT_F32, SH(D(4)));
    NodeId b = input(g, "b", DT_I32, SH(D(4)));
    nd(g, OP_MUL, DT_F32, SH(D(4)), IN(a, b), NO_AT);
    expect_problem(g, "node %2 (mul): operand dtypes differ: f32 vs i32");
    g = with_a(&a, DT_F32, SH(D(4)));
    nd(g, OP_SUB, DT_F32, SH(D(5)), IN(a, a), NO_AT);
    expect_problem(g, "node %1 (sub): shape is [5], expected [4]");
}

Test(verify, compare_gives_bool)
{
    NodeId a;
    Graph *g = with_a(&a, DT_F32, SH(D(4)));
    nd(g, OP_LT, DT_F32, SH(D(4)), IN(a, a), NO_AT);
    expect_problem(g, "node %1 (lt): dtype is f32, expected bool");
}

Test(verify, where_rules)
{
    NodeId a;
    Graph *g = with_a(&a, DT_F32, SH(D(4)));
    nd(g, OP_WHERE, DT_F32, SH(D(4)), IN(a, a, a), NO_AT);
    expect_problem(g, "node %1 (where): condition must be bool, got f32");
    g = ir_graph_new("t");
    NodeId c = input(g, "c", DT_BOOL, SH(D(4)));
    a = input(g, "a", DT_F32, SH(D(4)));
    NodeId b = input(g, "b", DT_F64, SH(D(4)));
    nd(g, OP_WHERE, DT_F32, SH(D(4)), IN(c, a, b), NO_AT);
    expect_problem(g, "node %3 (where): operand 2 dtype f64 differs from the result dtype f32");
    g = ir_graph_new("t");
    c = input(g, "c", DT_BOOL, SH(D(3)));
    a = input(g, "a", DT_F32, SH(D(4)));
    nd(g, OP_WHERE, DT_F32, SH(D(4)), IN(c, a, a), NO_AT);
    expect_problem(g, "node %2 (where): operand 0 shape [3] differs from the result shape [4]");
}

Test(verify, reduce_rules)
{
    int B;
    Graph *g = g_with_B(&B);
    NodeId a = input(g, "a", DT_F32, SH(SY(B), D(8)));
    nd(g, OP_REDUCE_SUM, DT_F32, SH(SY(B), D(1)), IN(a), AT(2));
    assert_valid(g);
    nd(g, OP_REDUCE_SUM, DT_F32, SH(SY(B), D(2)), IN(a), AT(2));
    expect_problem(g, "node %2 (reduce_sum): shape is [B, 2], expected [B, 1]");
    g = g_with_B(&B);
    a = input(g, "a", DT_F32, SH(SY(B), D(8)));
    nd(g, OP_REDUCE_MAX, DT_F32, SH(SY(B), D(1)), IN(a), AT(4));
    expect_problem(g, "node %1 (reduce_max): axes mask 0x4 names axes beyond the operand rank 2");
    g = g_with_B(&B);
    a = input(g, "a", DT_F32, SH(SY(B), D(8)));
    nd(g, OP_REDUCE_SUM, DT_F32, SH(D(1)), IN(a), AT(3));
    expect_problem(g, "node %1 (reduce_sum): shape is [1], expected [1, 1]");
    /* reduce_max's tie rule, `first`: 1 or absent, and on reduce_max only */
    g = g_with_B(&B);
    a = input(g, "a", DT_F32, SH(SY(B), D(8)));
    nd(g, OP_REDUCE_MAX, DT_F32, SH(SY(B), D(1)), IN(a), AT(2, 1));
    assert_valid(g);
    nd(g, OP_REDUCE_MAX, DT_F32, SH(SY(B), D(1)), IN(a), AT(2, 0));
    expect_problem(g, "node %2 (reduce_max): reduce_max's tie rule must be 1 (first), got 0");
    g = g_with_B(&B);
    a = input(g, "a", DT_F32, SH(SY(B), D(8)));
    nd(g, OP_REDUCE_SUM, DT_F32, SH(SY(B), D(1)), IN(a), AT(2, 1));
    expect_problem(g, "node %1 (reduce_sum): expects 1 attribute, got 2");
    expect_read_error("%0 = const 1.0 : f32[4]\n%1 = reduce_max %0 axes=[0] first=3 : f32[1]\n", false,
                      "t.ir:4:1: error: node %1 (reduce_max): reduce_max's tie rule must be 1 (first), got 3");
}

Test(verify, argmax_rules)
{
    NodeId a;
    Graph *g = with_a(&a, DT_F32, SH(D(4), D(8)));
    nd(g, OP_ARGMAX, DT_I32, SH(D(4), D(1)), IN(a), AT(1));
    expect_problem(g, "node %1 (argmax): dtype is i32, expected i64");
    g = with_a(&a, DT_F32, SH(D(4), D(8)));
    nd(g, OP_ARGMAX, DT_I64, SH(D(4), D(1)), IN(a), AT(2));
    expect_problem(g, "node %1 (argmax): axis 2 is out of range for rank 2");
}

Test(verify, reshape_element_counts)
{
    int B;
    Graph *g = g_with_B(&B);
    int T = ir_add_symbol(g, "T", 16);
    NodeId a = input(g, "a", DT_F32, SH(SY(B), SY(T), D(4)));
    Dim bt;
    ir_dim_mul(SY(B), SY(T), &bt);
    nd(g, OP_RESHAPE, DT_F32, SH(bt, D(4)), IN(a), NO_AT);
    assert_valid(g);
    nd(g, OP_RESHAPE, DT_F32, SH(SY(B), D(5)), IN(a), NO_AT);
    expect_problem(g, "node %2 (reshape): element counts differ: [B, T, 4] vs [B, 5]");
}

Test(verify, expand_rules)
{
    NodeId a;
    Graph *g = with_a(&a, DT_F32, SH(D(1), D(3)));
    nd(g, OP_EXPAND, DT_F32, SH(D(5), D(3)), IN(a), NO_AT);
    assert_valid(g);
    nd(g, OP_EXPAND, DT_F32, SH(D(5), D(4)), IN(a), NO_AT);
    expect_problem(g, "node %2 (expand): cannot expand [1, 3] to [5, 4]: dim 1 is neither 1 nor equal");
    g = with_a(&a, DT_F32, SH(D(3)));
    nd(g, OP_EXPAND, DT_F32, SH(D(5), D(3)), IN(a), NO_AT);
    expect_problem(g, "node %1 (expand): rank differs from the operand's: [5, 3] vs [3]");
}

Test(verify, permute_rules)
{
    NodeId a;
    Graph *g = with_a(&a, DT_F32, SH(D(2), D(3)));
    nd(g, OP_PERMUTE, DT_F32, SH(D(3), D(2)), IN(a), AT(0, 0));
    expect_problem(g, "node %1 (permute): perm is not a permutation of 0..1 (entry 1 is 0)");
    g = with_a(&a, DT_F32, SH(D(2), D(3)));
    nd(g, OP_PERMUTE, DT_F32, SH(D(2), D(3)), IN(a), AT(1, 0));
    expect_problem(g, "node %1 (permute): shape is [2, 3], expected [3, 2]");
}

Test(verify, slice_rules)
{
    int B;
    Graph *g = g_with_B(&B);
    NodeId a = input(g, "a", DT_F32, SH(SY(B), D(10)));
    nd(g, OP_SLICE, DT_F32, SH(SY(B), D(3)), IN(a), AT(1, 1, 8, 3));
    nd(g, OP_SLICE, DT_F32, SH(SY(B), D(0)), IN(a), AT(1, 4, 4, 1));
    assert_valid(g);
    nd(g, OP_SLICE, DT_F32, SH(SY(B), D(4)), IN(a), AT(1, 1, 8, 3));
    expect_problem(g, "node %3 (slice): shape is [B, 4], expected [B, 3]");
    static const struct { int64_t a[4]; const char *msg; } bad[] = {
        {{2, 0, 1, 1}, "axis 2 is out of range for rank 2"},
        {{1, -1, 3, 1}, "start -1 is negative"},
        {{1, 0, 3, 0}, "step 0 must be at least 1"},
        {{1, 0, 11, 1}, "end 11 is beyond the size 10 of axis 1"},
        {{1, 5, 3, 1}, "start 5 is after end 3"},
        {{0, 1, IR_SLICE_END, 1}, "axis 0 has symbolic size B, which can only be sliced whole"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        g = g_with_B(&B);
        a = input(g, "a", DT_F32, SH(SY(B), D(10)));
        nd(g, OP_SLICE, DT_F32, SH(SY(B), D(1)), IN(a), bad[i].a, 4);
        expect_problem(g, bad[i].msg);
    }
}

Test(verify, concat_rules)
{
    NodeId a;
    Graph *g = with_a(&a, DT_F32, SH(D(2), D(3)));
    NodeId b = input(g, "b", DT_F32, SH(D(2), D(4)));
    nd(g, OP_CONCAT, DT_F32, SH(D(2), D(7)), IN(a, b), AT(1));
    assert_valid(g);
    nd(g, OP_CONCAT, DT_F32, SH(D(2), D(8)), IN(a, b), AT(1));
    expect_problem(g, "node %3 (concat): axis 1 has size 8, but the operands add up to 7");
    g = with_a(&a, DT_F32, SH(D(2), D(3)));
    b = input(g, "b", DT_F32, SH(D(2), D(4)));
    nd(g, OP_CONCAT, DT_F32, SH(D(4), D(3)), IN(a, b), AT(0));
    expect_problem(g, "node %2 (concat): operand 1 shape [2, 4] differs from the result [4, 3] off the concat axis");
    g = with_a(&a, DT_F32, SH(D(2)));
    b = input(g, "b", DT_I32, SH(D(2)));
    nd(g, OP_CONCAT, DT_F32, SH(D(4)), IN(a, b), AT(0));
    expect_problem(g, "node %2 (concat): operand 1 dtype i32 differs from the result dtype f32");
}

Test(verify, pad_rules)
{
    NodeId a;
    Graph *g = with_a(&a, DT_F32, SH(D(2), D(3)));
    nd(g, OP_PAD, DT_F32, SH(D(3), D(3)), IN(a), AT(1, 0, 0, 0));
    assert_valid(g);
    nd(g, OP_PAD, DT_F32, SH(D(2), D(6)), IN(a), AT(0, 1, 0, 1));
    expect_problem(g, "node %2 (pad): shape is [2, 6], expected [2, 5]");
    g = with_a(&a, DT_F32, SH(D(2), D(3)));
    nd(g, OP_PAD, DT_F32, SH(D(2), D(2)), IN(a), AT(0, -1, 0, 0));
    expect_problem(g, "node %1 (pad): padding lo=-1 hi=0 on axis 1 is negative or too large");
}

Test(verify, gather_rules)
{
    Graph *g = ir_graph_new("t");
    NodeId t = input(g, "t", DT_F32, SH(D(10), D(4)));
    NodeId i = input(g, "i", DT_F32, SH(D(3)));
    nd(g, OP_GATHER, DT_F32, SH(D(3), D(4)), IN(t, i), NO_AT);
    expect_problem(g, "node %2 (gather): index dtype must be an integer type, got f32");
    g = ir_graph_new("t");
    t = input(g, "t", DT_F32, SH(D(10), D(4)));
    i = input(g, "i", DT_I64, SH(D(3), D(2)));
    nd(g, OP_GATHER, DT_F32, SH(D(3), D(4)), IN(t, i), NO_AT);
    expect_problem(g, "node %2 (gather): shape is [3, 4], expected [3, 2, 4]");
}

Test(verify, check_index_rules)
{
    Graph *g = ir_graph_new("t");
    NodeId i = input(g, "i", DT_I32, SH(D(3), D(2)));
    nd(g, OP_CHECK_INDEX, DT_I32, SH(D(3), D(2)), IN(i), AT(10));
    assert_valid(g);
    nd(g, OP_CHECK_INDEX, DT_I32, SH(D(3), D(2)), IN(i), AT(0));
    expect_problem(g, "node %2 (check_index): limit is 0, expected 1 to 2^32");
    g = ir_graph_new("t");
    i = input(g, "i", DT_F32, SH(D(3)));
    nd(g, OP_CHECK_INDEX, DT_F32, SH(D(3)), IN(i), AT(10));
    expect_problem(g, "node %1 (check_index): checks integer indices, got f32");
    g = ir_graph_new("t");
    i = input(g, "i", DT_I64, SH(D(3)));
    nd(g, OP_CHECK_INDEX, DT_I64, SH(D(4)), IN(i), AT(10));
    expect_problem(g, "node %1 (check_index): shape is [4], expected [3]");
}

Test(verify, scatter_add_rules)
{
    Graph *g = ir_graph_new("t");
    NodeId i = input(g, "i", DT_I64, SH(D(3), D(2)));
    NodeId s = input(g, "s", DT_F32, SH(D(3), D(2), D(4)));
    nd(g, OP_SCATTER_ADD, DT_F32, SH(D(10), D(4)), IN(i, s), NO_AT);
    assert_valid(g);
    nd(g, OP_SCATTER_ADD, DT_F32, SH(D(10), D(5)), IN(i, s), NO_AT);
    expect_problem(g, "node %3 (scatter_add): shape is [10, 5], expected [10, 4]");
    g = ir_graph_new("t");
    i = input(g, "i", DT_I64, SH(D(3)));
    s = input(g, "s", DT_F32, SH(D(2), D(4)));
    nd(g, OP_SCATTER_ADD, DT_F32, SH(D(10), D(4)), IN(i, s), NO_AT);
    expect_problem(g, "node %2 (scatter_add): source shape [2, 4] does not start with the index shape [3]");
}

Test(verify, matmul_rules)
{
    int B;
    Graph *g = g_with_B(&B);
    NodeId x = input(g, "x", DT_F32, SH(SY(B), D(784)));
    NodeId w = input(g, "w", DT_F32, SH(D(256), D(10)));
    nd(g, OP_MATMUL, DT_F32, SH(SY(B), D(10)), IN(x, w), NO_AT);
    expect_problem(g, "node %2 (matmul): inner dimensions differ: [B, 784] @ [256, 10]");
    g = ir_graph_new("t");
    x = input(g, "x", DT_I32, SH(D(2), D(3)));
    w = input(g, "w", DT_I32, SH(D(3), D(4)));
    nd(g, OP_MATMUL, DT_I32, SH(D(2), D(4)), IN(x, w), NO_AT);
    expect_problem(g, "node %2 (matmul): operand must be floating point, got i32");
    g = ir_graph_new("t");
    x = input(g, "x", DT_F32, SH(D(5), D(2), D(3)));
    w = input(g, "w", DT_F32, SH(D(6), D(3), D(4)));
    nd(g, OP_MATMUL, DT_F32, SH(D(5), D(2), D(4)), IN(x, w), NO_AT);
    expect_problem(g, "node %2 (matmul): batch dims differ: [5, 2, 3] @ [6, 3, 4]");
    g = ir_graph_new("t");
    x = input(g, "x", DT_F32, SH(D(3)));
    nd(g, OP_MATMUL, DT_F32, SH(D(1)), IN(x, x), NO_AT);
    expect_problem(g, "node %1 (matmul): operands must have the same rank >= 2: [3] @ [3]");
    g = ir_graph_new("t");
    x = input(g, "x", DT_F32, SH(D(2), D(3)));
    w = input(g, "w", DT_F32, SH(D(3), D(4)));
    nd(g, OP_MATMUL, DT_F32, SH(D(2), D(5)), IN(x, w), NO_AT);
    expect_problem(g, "node %2 (matmul): shape is [2, 5], expected [2, 4]");
}

Test(verify, unfold_fold_rules)
{
    int B;
    Graph *g = g_with_B(&B);
    NodeId x = input(g, "x", DT_F32, SH(SY(B), D(2), D(7), D(9)));
    /* kernel 3x2, stride 2x3, dilation 1x2: OH = (7-3)/2+1 = 3, OW = (9-3)/3+1 = 3 */
    NodeId u = nd(g, OP_UNFOLD, DT_F32, SH(SY(B), D(12), D(9)), IN(x), AT(3, 2, 2, 3, 1, 2));
    nd(g, OP_FOLD, DT_F32, SH(SY(B), D(2), D(7), D(9)), IN(u), AT(3, 2, 2, 3, 1, 2));
    assert_valid(g);
    nd(g, OP_UNFOLD, DT_F32, SH(SY(B), D(12), D(10)), IN(x), AT(3, 2, 2, 3, 1, 2));
    expect_problem(g, "node %3 (unfold): shape is [B, 12, 10], expected [B, 12, 9]");
    g = g_with_B(&B);
    x = input(g, "x", DT_F32, SH(SY(B), D(2), D(7), D(9)));
    nd(g, OP_UNFOLD, DT_F32, SH(SY(B), D(12), D(9)), IN(x), AT(3, 2, 0, 3, 1, 2));
    expect_problem(g, "node %1 (unfold): window attribute 2 is 0, expected at least 1");
    g = g_with_B(&B);
    x = input(g, "x", DT_F32, SH(D(1), D(2), SY(B), D(9)));
    nd(g, OP_UNFOLD, DT_F32, SH(D(1), D(4), D(9)), IN(x), AT(1, 2, 1, 1, 1, 1));
    expect_problem(g, "node %1 (unfold): image height and width must be constants, got [1, 2, B, 9]");
    g = ir_graph_new("t");
    x = input(g, "x", DT_F32, SH(D(1), D(12), D(8)));
    nd(g, OP_FOLD, DT_F32, SH(D(1), D(2), D(7), D(9)), IN(x), AT(3, 2, 2, 3, 1, 2));
    expect_problem(g, "node %1 (fold): operand shape is [1, 12, 8], expected [1, 12, 9] for result [1, 2, 7, 9]");
    g = ir_graph_new("t");
    x = input(g, "x", DT_F32, SH(D(1), D(2), D(2), D(2)));
    nd(g, OP_UNFOLD, DT_F32, SH(D(1), D(18), D(1)), IN(x), AT(3, 3, 1, 1, 1, 1));
    expect_problem(g, "node %1 (unfold): window 3x3 with dilation 1x1 does not fit in [1, 2, 2, 2]");
}

Test(verify, leaves_named_and_param_attrs_valid)
{
    Graph *g = ir_graph_new("t");
    nd(g, OP_INPUT, DT_F32, SH(D(2)), NO_IN, NO_AT);
    expect_problem(g, "node %0 (input): input has no name");
    g = ir_graph_new("t");
    NodeId p = param(g, "w", DT_F32, SH(D(2)), INIT_ZEROS, 0, 0, true);
    g->attrs[g->nodes[p].attrs] = 9;
    expect_problem(g, "node %0 (param): unknown init kind 9");
    g = ir_graph_new("t");
    p = param(g, "w", DT_F32, SH(D(2)), INIT_ZEROS, 0, 0, true);
    g->attrs[g->nodes[p].attrs + 1] = 2;
    expect_problem(g, "node %0 (param): trainable flag is 2, expected 0 or 1");
    g = ir_graph_new("t");
    input(g, "x", DT_F32, SH(D(2)));
    input(g, "x", DT_F32, SH(D(3)));
    expect_problem(g, "input name 'x' is used by more than one node");
}

Test(verify, iota_and_random_attrs)
{
    Graph *g = ir_graph_new("t");
    nd(g, OP_IOTA, DT_I64, SH(D(2)), NO_IN, AT(1));
    expect_problem(g, "node %0 (iota): axis 1 is out of range for rank 1");
    g = ir_graph_new("t");
    nd(g, OP_RANDOM_UNIFORM, DT_I32, SH(D(2)), NO_IN, AT(0));
    expect_problem(g, "node %0 (random_uniform): result must be floating point, got i32");
}

Test(verify, outputs_valid)
{
    NodeId a;
    Graph *g = with_a(&a, DT_F32, SH(D(2)));
    ir_add_output(g, OUT_FORWARD, "y", 5);
    expect_problem(g, "output 'y': refers to %5, which is not a node");
    g = with_a(&a, DT_F32, SH(D(2)));
    ir_add_output(g, OUT_LOSS, "l", a);
    expect_problem(g, "loss 'l': must be a floating-point scalar, but %0 is f32[2]");
    g = with_a(&a, DT_I64, SH(D(1), D(1)));
    ir_add_output(g, OUT_LOSS, "l", a);
    expect_problem(g, "loss 'l': must be a floating-point scalar, but %0 is i64[1, 1]");
    g = with_a(&a, DT_F32, SH(D(1), D(1)));
    ir_add_output(g, OUT_LOSS, "l", a);
    assert_valid(g);
    ir_add_output(g, OUT_GRAD, "w", a);
    ir_add_output(g, OUT_GRAD, "w", a);
    expect_problem(g, "grad 'w': the name is used by more than one grad output");
}

Test(verify, symbols_valid)
{
    Graph *g = ir_graph_new("t");
    ir_add_symbol(g, "B", 0);
    expect_problem(g, "symbol 'B': bound 0 is not between 1 and 2^32");
}

/* ---- DOT ---- */

Test(ir_dot, valid_dot)
{
    Graph *g = everything();
    StrBuf b;
    sb_init(&b);
    ir_print_dot(g, &b);
    ir_graph_free(g);
    cr_assert(!strncmp(b.data, "digraph \"mlp\" {\n", 16));
    cr_assert_not_null(strstr(b.data, "  n0 -> n1;\n"));
    cr_assert_not_null(strstr(b.data, "n2 [label=\"%2 param \\\"fc1.weight\\\"\\nuniform(-0.0357, 0.0357) trainable"));
    cr_assert_not_null(strstr(b.data, "shape=ellipse"));
    cr_assert_not_null(strstr(b.data, "-> out1;\n"));
    cr_assert(b.data[b.len - 2] == '}');
    if (access("/usr/bin/dot", X_OK) != 0) {
        sb_free(&b);
        cr_skip_test("graphviz is not installed");
    }
    char path[] = "/tmp/kiln_dot_XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    cr_assert_eq(write(fd, b.data, b.len), (ssize_t)b.len);
    close(fd);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "/usr/bin/dot -Tsvg -o /dev/null '%s' 2>&1", path);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    char out[4096];
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    int status = pclose(p);
    unlink(path);
    cr_assert_eq(status, 0, "dot failed: %s", out);
    cr_assert_eq(n, 0, "dot complained: %s", out);
    sb_free(&b);
}
