/* kiln_math.h — float exp and tanh that vectorise, for generated kernels.
 *
 * glibc's expf/tanhf are function calls the compiler cannot vectorise without
 * -ffast-math (which would also break NaN propagation that the generated code keeps), so
 * softmax, cross-entropy and GELU spent most of their time in them. These are the Cephes
 * single-precision algorithm (Moshier) for exp: range reduction by ln 2 and a degree-6
 * polynomial (max error about 1 ulp over the float range); tanh is a rational function
 * (below). Every branch is a select, so
 * a loop of them becomes SIMD code; NaN in gives NaN out, overflow gives inf, underflow 0
 * (through the subnormals). tests/test_math.c checks them against double precision. */
#ifndef KILN_MATH_H
#define KILN_MATH_H

#ifndef __CUDACC_RTC__ /* NVRTC: kiln_cuda.h defines the integers */
#include <stdint.h>
#include <string.h>
#endif

/* c ? a : b with no jump. Where the compiler cannot vectorise a loop (the nests over
 * 2x2 pooling windows), GCC compiles a float ternary into a jump around the arithmetic
 * of the taken side, and a ReLU or max-pooling mask goes either way at random: the
 * max-pool gradient kernel ran 5x slower with the jump than with this bit select. */
static inline float kiln_selectf(int c, float a, float b)
{
    uint32_t x, y, m = -(uint32_t)(c != 0);
    memcpy(&x, &a, sizeof x);
    memcpy(&y, &b, sizeof y);
    x = (x & m) | (y & ~m);
    memcpy(&a, &x, sizeof a);
    return a;
}

static inline double kiln_select(int c, double a, double b)
{
    uint64_t x, y, m = -(uint64_t)(c != 0);
    memcpy(&x, &a, sizeof x);
    memcpy(&y, &b, sizeof y);
    x = (x & m) | (y & ~m);
    memcpy(&a, &x, sizeof a);
    return a;
}

/* Sums in generated kernels: element k of a sum goes to lane k % KILN_SUM_LANES, each lane
 * adds in order, and the lanes are added as this fixed tree, so a sum has one order (one
 * result) whatever kernel computes it and however the compiler vectorises its loop
 * (codegen/c_loops.c, enum inner_layout). Eight lanes fill an AVX2 vector of floats. */
#define KILN_SUM_LANES 8
#define KILN_LANES_SUM(a) ((((a)[0] + (a)[1]) + ((a)[2] + (a)[3])) + (((a)[4] + (a)[5]) + ((a)[6] + (a)[7])))
/* Maxima in lanes as sums are (a plain `reduction(max: ...)` of a comparison is one Clang
 * does not vectorise): the lanes' maximum, and whether any lane saw a NaN. */
#define KILN_MAX2(x, y) ((y) > (x) ? (y) : (x))
#define KILN_LANES_MAX(a) \
    KILN_MAX2(KILN_MAX2(KILN_MAX2((a)[0], (a)[1]), KILN_MAX2((a)[2], (a)[3])), KILN_MAX2(KILN_MAX2((a)[4], (a)[5]), KILN_MAX2((a)[6], (a)[7])))
#define KILN_LANES_ANY(n) ((((n)[0] | (n)[1]) | ((n)[2] | (n)[3])) | (((n)[4] | (n)[5]) | ((n)[6] | (n)[7])))
#define KILN_LANES_NEG_INF {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY}
/* The same for column j of lanes a[KILN_SUM_LANES][...] (sums over leading axes). */
#define KILN_LANES_SUM_AT(a, j) \
    ((((a)[0][j] + (a)[1][j]) + ((a)[2][j] + (a)[3][j])) + (((a)[4][j] + (a)[5][j]) + ((a)[6][j] + (a)[7][j])))

/* Chunks of the rows of a total (a sum of every row to one value) that the threads share,
 * cut by the shape alone: each chunk sums its rows in order and the chunks' sums are added
 * in order, so the total does not depend on the number of threads (codegen/c_loops.c,
 * open_total_chunks). */
#define KILN_TOTAL_CHUNKS 64

/* Columns per block of a sum over leading axes (codegen/c_loops.c, emit_columns): a thread
 * walks down the rows of its block, so the block is the thread's share of the columns (in
 * multiples of 16, at most KILN_COLUMN_BLOCK_MAX: lanes of a[KILN_SUM_LANES][512] floats
 * are 16 KiB of stack). Narrow blocks read a short piece of each row, a page apart, which
 * the prefetcher does not follow: 64-column blocks made gpt's GELU backward twice as slow.
 * Each column is summed in one order whatever the width, so the bits do not depend on it,
 * nor on the threads: a column at the edge of a block goes through the vector loop's scalar
 * remainder, which rounds as a vector lane does (no contraction into fused multiply-adds:
 * the program is compiled as ISO C, -ffp-contract=off). */
#define KILN_COLUMN_BLOCK_MAX 512
static inline int64_t kiln_column_block(int64_t columns, int64_t threads)
{
    int64_t w = threads > 1 ? (columns + threads - 1) / threads : columns;
    w = (w + 15) / 16 * 16;
    return w < 16 ? 16 : w > KILN_COLUMN_BLOCK_MAX ? KILN_COLUMN_BLOCK_MAX : w;
}

/* 2^n for an integral float n in [-126, 127], by building the float's bits. Adding
 * 1.5 * 2^23 puts n in the low mantissa bits; no float-to-int conversion, which GCC will
 * not vectorise while trapping math is on. */
static inline float kiln_pow2f_(float n)
{
    union {
        float f;
        uint32_t u;
    } v = {.f = n + 12582912.0f}, r;
    r.u = (v.u - 0x4B400000u + 127u) << 23;
    return r.f;
}

static inline float kiln_expf(float x)
{
    const float lo = -104.0f, hi = 88.8f;
    float xc = x != x ? 0.0f : x < lo ? lo : x > hi ? hi : x;
    /* round to nearest by adding and removing 1.5 * 2^23 (floorf does not vectorise while
     * trapping math is on) */
    const float magic = 12582912.0f;
    float n = (xc * 1.44269504088896341f + magic) - magic;
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float e = p * r * r + r + 1.0f;
    /* 2^n in two factors, each a normal float, so subnormal results round once */
    float h = (n * 0.5f + magic) - magic;
    float y = e * kiln_pow2f_(h) * kiln_pow2f_(n - h);
    return x != x ? x : y;
}

/* tanh as p(x) / q(x), p odd of degree 13 and q even of degree 6, fitted (weighted least
 * squares on the relative error, then float32 coefficients) over |x| <= 7.9053, where the
 * fit is within 1.6e-9 in double and 3.3e-7 (about 3 ulp) evaluated in float. One division
 * and eleven multiply-adds: the exp-based form took twice as long, and GELU's tanh forward
 * and again in its backward made it most of gpt's MLP epilogues. p(x) = x (1 + ...) and
 * q(0) = 1, so tiny and subnormal x and -0 come out as themselves; from |x| = 9.01 tanh
 * rounds to +-1 in float. */
static inline float kiln_tanhf(float x)
{
    const float clamp = 7.90531110763549805f;
    float xc = x > clamp ? clamp : x;
    xc = xc < -clamp ? -clamp : xc;
    float z = xc * xc;
    float p = -1.190523645e-13f;
    p = p * z + 6.476604669e-11f;
    p = p * z + -2.251433173e-08f;
    p = p * z + 1.168703784e-05f;
    p = p * z + 3.153421916e-03f;
    p = p * z + 1.312793195e-01f;
    p = p * z + 1.0f;
    float q = 2.618996077e-04f;
    q = q * z + 2.469099686e-02f;
    q = q * z + 4.646126330e-01f;
    q = q * z + 1.0f;
    float y = xc * p / q;
    float one = x < 0 ? -1.0f : 1.0f;
    return ((x > 9.01f) | (x < -9.01f)) ? one : y; /* NaN: y is NaN */
}

#endif
