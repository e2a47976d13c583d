/* kiln_half.h — half-precision storage for the generated C (mixed precision,
 * passes/precision.c): bf16 is stored as uint16_t, the top half of a float, rounded to
 * nearest even with NaN kept a (quiet) NaN; fp16 is C's _Float16 (GCC 12 on x86-64; with
 * -march=native on a CPU with F16C the conversions are single vcvtps2ph/vcvtph2ps
 * instructions). Values are widened to float wherever they are computed, so a half-precision
 * tensor only changes what is stored: memory and bandwidth, not the arithmetic. The same
 * rounding is ir/interp.c's, so generated kernels and the interpreter agree. */
#ifndef KILN_HALF_H
#define KILN_HALF_H

#include <stdint.h>
#include <string.h>

static inline float kiln_bf16_to_f32(uint16_t h)
{
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t kiln_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* NaN stays NaN (quiet) */
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest, ties to even; overflow carries into inf */
    return (uint16_t)(u >> 16);
}

/* f rounded to the nearest bf16, as a float. */
static inline float kiln_bf16_round(float f) { return kiln_bf16_to_f32(kiln_f32_to_bf16(f)); }

/* f rounded to the nearest fp16, as a float. */
static inline float kiln_f16_round(float f) { return (float)(_Float16)f; }

#endif
