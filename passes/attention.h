/* attention.h — attention found in a graph of primitive ops (attention.c): softmax(q kᵀ ·
 * scale + mask) v, however it was written — the built-ins (scaled_dot_product_attention,
 * CausalSelfAttention, MultiheadAttention) and attention a user writes out of matmul,
 * transpose, masked_fill or an added mask, softmax and dropout — so that one fused kernel
 * can replace it (issue 38) and the report can say where it is and what its T×T
 * probabilities cost. A pattern that is not exactly attention is not matched. */
#ifndef KILN_PASSES_ATTENTION_H
#define KILN_PASSES_ATTENTION_H

#include "../ir/ir.h"

typedef struct {
    NodeId out;    /* probs @ v: [..., T, Dv] */
    NodeId q;      /* [..., H, T, D] as it enters the product (before a scale folded into it) */
    NodeId kt;     /* kᵀ [..., H, D, S]: a permute of k */
    NodeId k;      /* kᵀ's operand: k laid out by kᵀ's permutation with its last two swapped */
    NodeId v;      /* [..., H, S, Dv] */
    NodeId k_heads, v_heads; /* the k and v of fewer heads a GQA expansion repeats, else k and v */
    NodeId scores; /* the q kᵀ product, [..., T, S] */
    NodeId probs;  /* the softmax's (or its dropout's) output, [..., T, S]: what fusion removes */
    AttnMask mask;    /* ops.h */
    NodeId mask_node; /* ATTN_MASK_KEEP's or _DROP's bool, ATTN_MASK_ADD's float (else IR_NONE) */
    double scale;     /* the scores' factor (the product of every constant factor found) */
    double dropout;   /* the probabilities' dropout rate, 0 when none */
    NodeId random;    /* with dropout: the random_uniform [..., T, S] it compares (its stream) */
    int64_t heads, kv_heads; /* kv_heads < heads: grouped-query attention */
} AttentionMatch;

/* Every attention in g, in node order: how many (*out malloc'd, NULL when none). */
int attention_find(const Graph *g, AttentionMatch **out);

#endif
