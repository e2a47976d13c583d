/* kiln_attention_desc.h — what a fused attention kernel is told: the sizes, each operand's
 * strides, the mask and the dropout of one attention op (ir/ops.h). One struct for both
 * targets: the C target's kernels (kiln_attention.h) take it by pointer, the CUDA target's
 * (cuda/kiln_cuda_attention.h) by value as a kernel argument, so it holds no host state:
 * its mask pointers are the target's memory. Plain C, and C++ for model.cu. */
#ifndef KILN_ATTENTION_DESC_H
#define KILN_ATTENTION_DESC_H

#ifndef __CUDACC_RTC__ /* NVRTC: kiln_cuda.h defines the integers */
#include <stdint.h>
#endif

enum { KILN_ATTN_NONE, KILN_ATTN_CAUSAL, KILN_ATTN_KEEP, KILN_ATTN_DROP, KILN_ATTN_ADD };

typedef struct {
    int64_t B, H, kv_heads, T, S, D, DV;
    int64_t q_st[4], k_st[4], v_st[4], o_st[4]; /* strides: batch, head, row, column of q,
                                                   k, v and out (the output written, or read
                                                   by the backward) */
    int64_t do_st[4];                           /* the backward's dout (all 0: out's) */
    int64_t dq_st[4], dk_st[4], dv_st[4];       /* the backward's dq, dk, dv (all 0: q's, k's, v's) */
    float scale;
    int mask;                 /* KILN_ATTN_*: causal keeps key s <= query t */
    const uint8_t *mask_bool; /* KEEP: nonzero keeps; DROP: nonzero drops */
    const float *mask_add;    /* ADD: added to the scaled scores */
    int64_t mask_st[4];       /* the mask's strides over (batch, head, t, s), 0 to broadcast */
    float dropout;            /* the probabilities' dropout rate (0: none) */
    uint64_t seed, step, stream;
} kiln_attention;

#endif
