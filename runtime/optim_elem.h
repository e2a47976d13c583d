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

#ifndef __CUDACC_RTC__ /* NVRTC (device.cu's kernels): kiln_cuda.h gives what they use */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "kiln_rt.h"
#endif

#if defined(__CUDACC__) || defined(KILN_CUDA_EMU)
#define KRT_ELEM static __host__ __device__ __forceinline__
#define KRT_RESTRICT __restrict__
#elif defined(__cplusplus) /* device.cu's host code in a GPU program whose kernels NVRTC compiled */
#define KRT_ELEM static inline __attribute__((always_inline))
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

/* RMSprop's scalars for one step. */
typedef struct {
    float wd, alpha, w, eps, mom, neg_lr;
} krt_rmsprop_k;

/* Adagrad's scalars for one step. */
typedef struct {
    float wd, eps, neg_clr;
} krt_adagrad_k;

/* Lion's scalars for one step. */
typedef struct {
    float shrink, b1, w1, b2, w2, neg_lr;
} krt_lion_k;

/* What varies between SGD's loops: L2 decay, momentum, the first step (the momentum buffer
 * is seeded with the gradient, PyTorch's `buf = clone(grad)`), Nesterov. */
enum { KRT_SGD_L2 = 1, KRT_SGD_MOMENTUM = 2, KRT_SGD_FIRST = 4, KRT_SGD_NESTEROV = 8 };
/* Adam's: AdamW's decoupled decay, Adam's L2 decay, lerp's formula for weight 1 - beta1,
 * amsgrad's maximum of the second moments. */
enum { KRT_ADAM_DECOUPLED = 1, KRT_ADAM_L2 = 2, KRT_ADAM_SMALL_W = 4, KRT_ADAM_AMSGRAD = 8 };
/* RMSprop's: L2 decay, momentum, centred. Adagrad's and Lion's: weight decay. */
enum { KRT_RMSPROP_L2 = 1, KRT_RMSPROP_MOMENTUM = 2, KRT_RMSPROP_CENTERED = 4 };
enum { KRT_DECAY = 1 };

#ifndef __CUDACC_RTC__ /* the host sets the scalars up */
/* The configuration and rate of one span: a parameter group's (torch.optim's param_groups)
 * lr and weight_decay replace the step's rate and the config's weight_decay. */
static inline double krt_span_config(const krt_optim_config *c, const krt_param_span *sp, double lr, krt_optim_config *out)
{
    *out = *c;
    if (!sp->grouped) return lr;
    out->weight_decay = sp->weight_decay;
    return sp->lr;
}

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
    return (decoupled ? KRT_ADAM_DECOUPLED : 0) | (l2 ? KRT_ADAM_L2 : 0) | (small_w ? KRT_ADAM_SMALL_W : 0) |
           (c->amsgrad ? KRT_ADAM_AMSGRAD : 0);
}

/* RMSprop's scalars and variant for a span. */
static inline int krt_rmsprop_setup(const krt_optim_config *c, double lr, bool decay, krt_rmsprop_k *k)
{
    k->wd = (float)c->weight_decay;     /* grad.add(param, alpha=weight_decay) */
    k->alpha = (float)c->alpha;         /* square_avg.mul_(alpha) */
    k->w = (float)(1.0 - c->alpha);     /* addcmul_(grad, grad, value=1 - alpha) */
    k->eps = (float)c->eps;             /* avg.add_(eps) */
    k->mom = (float)c->momentum;        /* buf.mul_(momentum) */
    k->neg_lr = (float)(-lr);           /* param.add_(buf, alpha=-lr) / addcdiv_(value=-lr) */
    const bool l2 = decay && c->weight_decay != 0;
    return (l2 ? KRT_RMSPROP_L2 : 0) | (c->momentum > 0 ? KRT_RMSPROP_MOMENTUM : 0) | (c->centered ? KRT_RMSPROP_CENTERED : 0);
}

/* Adagrad's scalars and variant for a span at optimizer step `step` (already incremented). */
static inline int krt_adagrad_setup(const krt_optim_config *c, int64_t step, double lr, bool decay, krt_adagrad_k *k)
{
    const double clr = lr / (1.0 + (double)(step - 1) * c->lr_decay); /* in double, as Python */
    k->wd = (float)c->weight_decay;
    k->eps = (float)c->eps;
    k->neg_clr = (float)(-clr); /* param.addcdiv_(grad, std, value=-clr) */
    return decay && c->weight_decay != 0 ? KRT_DECAY : 0;
}

/* Lion's scalars and variant for a span. */
static inline int krt_lion_setup(const krt_optim_config *c, double lr, bool decay, krt_lion_k *k)
{
    k->shrink = (float)(1.0 - lr * c->weight_decay); /* p.mul_(1 - lr * wd) */
    k->b1 = (float)c->beta1;                         /* exp_avg.mul(beta1) */
    k->w1 = (float)(1.0 - c->beta1);                 /* .add(grad, alpha=1 - beta1) */
    k->b2 = (float)c->beta2;
    k->w2 = (float)(1.0 - c->beta2);
    k->neg_lr = (float)(-lr); /* p.add_(update, alpha=-lr) */
    return decay && c->weight_decay != 0 ? KRT_DECAY : 0;
}

#endif

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

/* torch.maximum(a, b): NaN when either is. */
KRT_ELEM float krt_maximum(float a, float b) { return (a != a || a > b) ? a : b; }

/* torch.optim.Adam / AdamW for element i: `decoupled` is AdamW's decay, `l2` Adam's,
 * `small_w` picks lerp's formula for the weight 1 - beta1, `amsgrad` keeps the maximum of
 * the second moments in vmax (max_exp_avg_sq) and divides by it. */
KRT_ELEM void krt_adam_elem(const krt_adam_k *k, bool decoupled, bool l2, bool small_w, bool amsgrad, float *KRT_RESTRICT p,
                            const float *KRT_RESTRICT grads, float *KRT_RESTRICT m, float *KRT_RESTRICT v,
                            float *KRT_RESTRICT vmax, int64_t i)
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
    float vd = vi;
    if (amsgrad) {
        vd = krt_maximum(vmax[i], vi); /* torch.maximum(max_exp_avg_sq, exp_avg_sq, out=max_exp_avg_sq) */
        vmax[i] = vd;
    }
    float denom = sqrtf(vd);
    denom = denom / k->bias2_sqrt;
    denom = denom + k->eps;
    float u = k->neg_step_size * mi;
    u = u / denom;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi + u;
}

/* torch.optim.RMSprop for element i: `l2` weight decay, `use_mom` momentum (buffer buf),
 * `centered` the centred variant (gradient average gavg). */
KRT_ELEM void krt_rmsprop_elem(const krt_rmsprop_k *k, bool l2, bool use_mom, bool centered, float *KRT_RESTRICT p,
                               const float *KRT_RESTRICT grads, float *KRT_RESTRICT sq, float *KRT_RESTRICT gavg,
                               float *KRT_RESTRICT buf, int64_t i)
{
    float g = grads[i];
    if (l2) {
        float t = k->wd * p[i];
        g = g + t;
    }
    float s = sq[i] * k->alpha; /* square_avg.mul_(alpha).addcmul_(grad, grad, value=1 - alpha) */
    float t = k->w * g;
    t = t * g;
    s = s + t;
    sq[i] = s;
    float avg;
    if (centered) {
        float a = gavg[i] * k->alpha; /* grad_avg.mul_(alpha).add_(grad, alpha=1 - alpha) */
        float u = k->w * g;
        a = a + u;
        gavg[i] = a;
        float na = -a; /* square_avg.addcmul(grad_avg, grad_avg, value=-1).sqrt_() */
        na = na * a;
        avg = s + na;
        avg = sqrtf(avg);
    } else {
        avg = sqrtf(s);
    }
    avg = avg + k->eps;
    if (use_mom) {
        float b = buf[i] * k->mom; /* buf.mul_(momentum).addcdiv_(grad, avg) */
        float q = g / avg;
        b = b + q;
        buf[i] = b;
        float u = k->neg_lr * b; /* param.add_(buf, alpha=-lr) */
        p[i] = p[i] + u;
    } else {
        float u = k->neg_lr * g; /* param.addcdiv_(grad, avg, value=-lr) */
        u = u / avg;
        p[i] = p[i] + u;
    }
}

/* torch.optim.Adagrad for element i (dense gradients): `l2` weight decay, sum the
 * accumulated squares. */
KRT_ELEM void krt_adagrad_elem(const krt_adagrad_k *k, bool l2, float *KRT_RESTRICT p, const float *KRT_RESTRICT grads,
                               float *KRT_RESTRICT sum, int64_t i)
{
    float g = grads[i];
    if (l2) {
        float t = k->wd * p[i];
        g = g + t;
    }
    float t = g * g; /* state_sum.addcmul_(grad, grad, value=1) */
    float s = sum[i] + t;
    sum[i] = s;
    float std = sqrtf(s); /* state_sum.sqrt().add_(eps) */
    std = std + k->eps;
    float u = k->neg_clr * g; /* param.addcdiv_(grad, std, value=-clr) */
    u = u / std;
    p[i] = p[i] + u;
}

/* Lion (Chen et al. 2023, as lucidrains/lion-pytorch) for element i: `decay` the decoupled
 * weight decay, m the momentum (exp_avg). torch.sign: (0 < x) - (x < 0). */
KRT_ELEM void krt_lion_elem(const krt_lion_k *k, bool decay, float *KRT_RESTRICT p, const float *KRT_RESTRICT grads,
                            float *KRT_RESTRICT m, int64_t i)
{
    float pi = p[i];
    if (decay) pi = pi * k->shrink; /* p.data.mul_(1 - lr * wd) */
    float g = grads[i];
    float mi = m[i];
    float c = mi * k->b1; /* exp_avg.clone().mul_(beta1).add(grad, alpha=1 - beta1).sign_() */
    float t = k->w1 * g;
    c = c + t;
    float sgn = (float)((0.0f < c) - (c < 0.0f));
    float u = k->neg_lr * sgn; /* p.add_(update, alpha=-lr) */
    p[i] = pi + u;
    mi = mi * k->b2; /* exp_avg.mul_(beta2).add_(grad, alpha=1 - beta2) */
    t = k->w2 * g;
    m[i] = mi + t;
}

/* The clipping factor: torch.nn.utils.clip_grad_norm_'s max_norm / (norm + 1e-6), in
 * double; the gradients are multiplied by it, rounded to float32, only when it is below 1. */
#ifndef __CUDACC_RTC__
static inline double krt_clip_coef(double norm, double max_norm) { return max_norm / (norm + 1e-6); }
#endif

#endif
