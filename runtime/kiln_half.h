/* kiln_half.h — half-precision storage for the generated C (mixed precision,
 * passes/precision.c): bf16 is stored as uint16_t, the top half of a float, rounded to
 * nearest even with NaN kept a (quiet) NaN; fp16 is stored as uint16_t too, IEEE binary16
 * bits, converted by the branch-free integer code below: GCC 12 converts C's _Float16 one
 * element at a time (vcvtsh2ss, or a libgcc call), which kept every loop with a conversion
 * from vectorising (gpt's step 2.8x slower than fp32), while these vectorise. They give
 * _Float16's results bit for bit (tests/test_precision.c checks them against it, every
 * half and a sweep of floats). Values are widened to float wherever they are computed, so a half-precision
 * tensor only changes what is stored: memory and bandwidth, not the arithmetic. The same
 * rounding is ir/interp.c's, so generated kernels and the interpreter agree. */
#ifndef KILN_HALF_H
#define KILN_HALF_H

#ifndef __CUDACC_RTC__ /* NVRTC: kiln_cuda.h defines the integers */
#include <stdint.h>
#include <string.h>
#endif

/* The CUDA target's kernels call them on the device (model.cu includes kiln_cuda.h first):
 * the same integer code, so that the GPU rounds as the C target and the interpreter do. On
 * the CPU they are always inlined: GCC left kiln_f32_to_f16 out of line in large fused
 * kernels, whose loops then called it element by element (15% of gpt's fp16 step). */
#if defined(__CUDACC__) || defined(KILN_CUDA_EMU)
#define KILN_HALF_FN static __host__ __device__ inline
#else
#define KILN_HALF_FN static inline __attribute__((always_inline))
#endif

KILN_HALF_FN float kiln_bf16_to_f32(uint16_t h)
{
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

KILN_HALF_FN uint16_t kiln_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* NaN stays NaN (quiet) */
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest, ties to even; overflow carries into inf */
    return (uint16_t)(u >> 16);
}

/* f rounded to the nearest bf16, as a float. */
KILN_HALF_FN float kiln_bf16_round(float f) { return kiln_bf16_to_f32(kiln_f32_to_bf16(f)); }

KILN_HALF_FN float kiln_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

KILN_HALF_FN uint32_t kiln_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* f rounded to bf16 stochastically, as a float: the 16 random bits floor(u * 2^16) of u
 * (uniform in [0, 1) with 24 random bits, kiln_rng_uniform24) are added to f's low 16 bits
 * before they are dropped, so f's magnitude rounds away from zero with probability (its
 * distance from the bf16 value toward zero) / (the step between the two), and the expected
 * result is f (llm.c's stochastic_rounding). inf stays inf, a NaN stays a (quiet) NaN, and
 * past the largest bf16 the carry reaches inf. */
KILN_HALF_FN float kiln_bf16_round_stochastic(float f, float u)
{
    const uint32_t x = kiln_f32_bits(f), r = (uint32_t)(u * 65536.0f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return kiln_bits_f32((x | 0x400000u) & 0xffff0000u);
    return kiln_bits_f32((x + r) & 0xffff0000u);
}

/* Round to nearest even; beyond 65504 (from 65520 up) to inf; NaN to a quiet NaN. */
KILN_HALF_FN uint16_t kiln_f32_to_f16(float f)
{
    const uint32_t x = kiln_f32_bits(f), sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
    /* a subnormal result (|f| < 2^-14): the significand shifted right by 126 - exponent
     * (at most 31: smaller values round to 0), rounded to nearest even by hand */
    const uint32_t e = a >> 23, shift = e < 95u ? 31u : e > 125u ? 1u : 126u - e; /* 1..31: defined shifts in every lane */
    const uint32_t mant = (a & 0x7fffffu) | 0x800000u, half = 1u << (shift - 1u);
    /* as the normal path: add half - 1 plus the lowest kept bit, then shift (a carry out of
     * the subnormal range gives the smallest normal's bits); comparisons of rest with half
     * made GCC 12 convert to bool and leave loops with the conversion scalar (gpt fp16's
     * layer norm) */
    const uint32_t sub = (mant + (half - 1u) + ((mant >> shift) & 1u)) >> shift;
    /* a normal one: rebias the exponent (-112 << 23), add 0xfff plus the lowest kept bit
     * (ties to even), keep the top bits */
    const uint32_t normal = (a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13;
    const uint32_t huge = a > 0x7f800000u ? 0x7e00u : 0x7c00u;
    /* the choice as masks, not selects: GCC 12 narrowed the selects' operands to 16 bits
     * apiece and then could not vectorise a loop that also computes in 32 */
    const uint32_t is_huge = 0u - (uint32_t)(a >= 0x477ff000u), is_sub = 0u - (uint32_t)(a < 0x38800000u);
    const uint32_t h = (huge & is_huge) | (sub & is_sub & ~is_huge) | (normal & ~is_sub & ~is_huge);
    return (uint16_t)(h | sign);
}

KILN_HALF_FN float kiln_f16_to_f32(uint16_t h)
{
    const uint32_t sign = ((uint32_t)h & 0x8000u) << 16, e = (uint32_t)h & 0x7c00u, m = (uint32_t)h & 0x3ffu;
    const uint32_t normal = (((uint32_t)h & 0x7fffu) << 13) + 0x38000000u;
    const uint32_t special = (((uint32_t)h & 0x7fffu) << 13) | 0x7f800000u; /* inf, NaN */
    const uint32_t sub = kiln_f32_bits((float)(int32_t)m * 0x1p-24f); /* m < 2^10: a signed conversion, which vectorises */
    const uint32_t u = e == 0x7c00u ? special : e == 0 ? sub : normal;
    return kiln_bits_f32(u | sign);
}

/* f rounded to the nearest fp16, as a float. */
KILN_HALF_FN float kiln_f16_round(float f) { return kiln_f16_to_f32(kiln_f32_to_f16(f)); }

#endif
