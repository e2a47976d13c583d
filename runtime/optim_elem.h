/* optim_elem.h — one element of each optimizer's update, and the scalars it uses, shared
 * by the host's optimizer (optim.c) and the CUDA device's (runtime/cuda/device.cu), so
 * that a model trained on the GPU takes exactly the host's steps: the same float
 * operations in the same order, each its own statement (optim.c explains why: PyTorch's
 * single-tensor path, no contraction; device.cu is compiled with nvcc -fmad=false).
 *
 * The gradient norm's summation order is fixed here too: blocks of KRT_NORM_BLOCK
 * elements, each with KRT_NORM_LANES double accumulators (element i of a block goes to
 * lane i mod KRT_NORM_LANES), the lanes added in order, then the blocks in order. */
#ifndef KILN_OPTIM_ELEM_H
#define KILN_OPTIM_ELEM_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "kiln_rt.h"

#if defined(__CUDACC__) || defined(KILN_CUDA_EMU)
#define KRT_ELEM static __host__ __device__ __forceinline__
#define KRT_RESTRICT __restrict__
#else
#define KRT_ELEM static inline __attribute__((always_inline))
#define KRT_RESTRICT restrict
#endif

#define KRT_NORM_BLOCK 16384
#define KRT_NORM_LANES 8

/* SGD's scalars for one step. */
typedef struct {
    float wd, mom, keep, neg_lr;
} krt_sgd_k;

/* Adam's and AdamW's scalars for one step. */
typedef struct {
    float wd, shrink, w1, one_minus_w1, b2, w2, bias2_sqrt, neg_step_size, eps;
} krt_adam_k;

/* What varies between SGD's loops: L2 decay, momentum, the first step (the momentum buffer
 * is seeded with the gradient, PyTorch's `buf = clone(grad)`), Nesterov. */
enum { KRT_SGD_L2 = 1, KRT_SGD_MOMENTUM = 2, KRT_SGD_FIRST = 4, KRT_SGD_NESTEROV = 8 };
/* Adam's: AdamW's decoupled decay, Adam's L2 decay, lerp's formula for weight 1 - beta1. */
enum { KRT_ADAM_DECOUPLED = 1, KRT_ADAM_L2 = 2, KRT_ADAM_SMALL_W = 4 };

/* SGD's scalars and variant for a span (decay: weight decay applies to it). */
static inline int krt_sgd_setup(const krt_optim_config *c, bool first, double lr, bool decay, krt_sgd_k *k)
{
    k->wd = (float)c->weight_decay;
    k->mom = (float)c->momentum;
    k->keep = (float)(1.0 - c->dampening); /* add_(grad, alpha=1 - dampening) */
    k->neg_lr = (float)(-lr);              /* param.add_(grad, alpha=-lr) */
    const bool l2 = decay && c->weight_decay != 0;
    const bool use_mom = c->momentum != 0;
    const bool nesterov = use_mom && c->nesterov;
    first = use_mom && first;
    return (l2 ? KRT_SGD_L2 : 0) | (use_mom ? KRT_SGD_MOMENTUM : 0) | (first ? KRT_SGD_FIRST : 0) | (nesterov ? KRT_SGD_NESTEROV : 0);
}

/* Adam's scalars and variant for a span at optimizer step `step` (already incremented). */
static inline int krt_adam_setup(const krt_optim_config *c, int64_t step, double lr, bool decay, krt_adam_k *k)
{
    const bool adamw = c->kind == KRT_ADAMW;
    const bool l2 = !adamw && decay && c->weight_decay != 0;
    const bool decoupled = adamw && decay;
    const double bias1 = 1.0 - pow(c->beta1, (double)step);
    const double bias2 = 1.0 - pow(c->beta2, (double)step);
    k->wd = (float)c->weight_decay;
    k->shrink = (float)(1.0 - lr * c->weight_decay); /* AdamW: param.mul_(1 - lr*wd) */
    k->w1 = (float)(1.0 - c->beta1);                 /* exp_avg.lerp_(grad, 1 - beta1) */
    k->b2 = (float)c->beta2;
    k->w2 = (float)(1.0 - c->beta2); /* addcmul_(grad, grad, value=1 - beta2) */
    k->bias2_sqrt = (float)sqrt(bias2);
    k->neg_step_size = (float)(-(lr / bias1)); /* addcdiv_(m, denom, value=-step_size) */
    k->eps = (float)c->eps;
    k->one_minus_w1 = 1.0f - k->w1;
    const bool small_w = fabsf(k->w1) < 0.5f;
    return (decoupled ? KRT_ADAM_DECOUPLED : 0) | (l2 ? KRT_ADAM_L2 : 0) | (small_w ? KRT_ADAM_SMALL_W : 0);
}

/* torch.optim.SGD for element i. */
KRT_ELEM void krt_sgd_elem(const krt_sgd_k *k, bool l2, bool use_mom, bool first, bool nesterov, float *KRT_RESTRICT p,
                           const float *KRT_RESTRICT grads, float *KRT_RESTRICT buf, int64_t i)
{
    float g = grads[i];
    if (l2) {
        float t = k->wd * p[i];
        g = g + t;
    }
    if (use_mom) {
        float b;
        if (first) {
            b = g;
        } else {
            float t = k->keep * g;
            b = buf[i] * k->mom;
            b = b + t;
        }
        buf[i] = b;
        if (nesterov) {
            float t = k->mom * b;
            g = g + t;
        } else {
            g = b;
        }
    }
    float u = k->neg_lr * g;
    p[i] = p[i] + u;
}

/* torch.optim.Adam / AdamW for element i: `decoupled` is AdamW's decay, `l2` Adam's,
 * `small_w` picks lerp's formula for the weight 1 - beta1. */
KRT_ELEM void krt_adam_elem(const krt_adam_k *k, bool decoupled, bool l2, bool small_w, float *KRT_RESTRICT p,
                            const float *KRT_RESTRICT grads, float *KRT_RESTRICT m, float *KRT_RESTRICT v, int64_t i)
{
    float pi = p[i];
    if (decoupled) pi = pi * k->shrink;
    float g = grads[i];
    if (l2) {
        float t = k->wd * pi;
        g = g + t;
    }
    float mi = m[i];
    float diff = g - mi;
    if (small_w) {
        float t = k->w1 * diff;
        mi = mi + t;
    } else {
        float t = diff * k->one_minus_w1;
        mi = g - t;
    }
    float vi = v[i] * k->b2;
    float t = k->w2 * g;
    t = t * g;
    vi = vi + t;
    float denom = sqrtf(vi);
    denom = denom / k->bias2_sqrt;
    denom = denom + k->eps;
    float u = k->neg_step_size * mi;
    u = u / denom;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi + u;
}

/* The clipping factor: torch.nn.utils.clip_grad_norm_'s max_norm / (norm + 1e-6), in
 * double; the gradients are multiplied by it, rounded to float32, only when it is below 1. */
static inline double krt_clip_coef(double norm, double max_norm) { return max_norm / (norm + 1e-6); }

#endif
