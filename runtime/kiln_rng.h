/* kiln_rng.h — the counter-based random generator shared by the compiler, the interpreter and
 * the generated code. A value is a pure function of (seed, a, b, index), so a run is
 * reproducible, resume is exact and a dropout mask can be recomputed in the backward pass
 * without being stored. The mixing function is SplitMix64's finaliser (Stafford's Mix13)
 * applied to the combined key; it passes BigCrush as a counter-based generator. */
#ifndef KILN_RNG_H
#define KILN_RNG_H

#ifndef __CUDACC_RTC__ /* NVRTC: kiln_cuda.h defines the integers */
#include <math.h>
#include <stdint.h>
#endif

/* The CUDA target's kernels call it on the device (model.cu includes kiln_cuda.h first). */
#if defined(__CUDACC__) || defined(KILN_CUDA_EMU)
#define KILN_RNG_FN static __host__ __device__ inline
#else
#define KILN_RNG_FN static inline
#endif

KILN_RNG_FN uint64_t kiln_rng_mix(uint64_t z)
{
    z += UINT64_C(0x9e3779b97f4a7c15);
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

/* 64 random bits for element `index` of stream (a, b) under `seed`. */
KILN_RNG_FN uint64_t kiln_rng_bits(uint64_t seed, uint64_t a, uint64_t b, uint64_t index)
{
    uint64_t k = kiln_rng_mix(seed ^ kiln_rng_mix(a ^ kiln_rng_mix(b)));
    return kiln_rng_mix(k ^ kiln_rng_mix(index));
}

/* Uniform in [0, 1) with 24 random bits: exactly representable in float32, so the C, CUDA
 * and interpreter paths agree bit for bit. */
KILN_RNG_FN float kiln_rng_uniform24(uint64_t seed, uint64_t a, uint64_t b, uint64_t index)
{
    return (float)(kiln_rng_bits(seed, a, b, index) >> 40) * (1.0f / 16777216.0f);
}

/* Uniform in (0, 1) with 53 bits, never 0 (safe for log). */
KILN_RNG_FN double kiln_rng_uniform53(uint64_t seed, uint64_t a, uint64_t b, uint64_t index)
{
    return ((double)(kiln_rng_bits(seed, a, b, index) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

/* Standard normal by Box-Muller from the two uniforms of (index*2, index*2+1). */
KILN_RNG_FN double kiln_rng_normal(uint64_t seed, uint64_t a, uint64_t b, uint64_t index)
{
    double u1 = kiln_rng_uniform53(seed, a, b, 2 * index);
    double u2 = kiln_rng_uniform53(seed, a, b, 2 * index + 1);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

#ifndef __CUDACC_RTC__ /* the host's (NVRTC compiles device functions alone) */
/* The stream key of a parameter: FNV-1a 64 of its state_dict name, so initialisation does
 * not depend on the order parameters are declared or stored in. */
static inline uint64_t kiln_rng_name_key(const char *name)
{
    uint64_t h = UINT64_C(0xcbf29ce484222325);
    for (; *name; name++) h = (h ^ (unsigned char)*name) * UINT64_C(0x100000001b3);
    return h;
}
#endif

#endif
