// attention.cu — the CUDA target's fused attention kernels (runtime/cuda/kiln_cuda_attention.h)
// behind host entry points, as a generated model.cu wraps and launches them
// (codegen/cuda_attention.c): tests/test_cuda_attention.c runs them under the emulator
// against the C target's kernels (runtime/kiln_attention.h); tests/test_cuda_emu_nvcc.c
// compiles this file with nvcc for sm_80 and sm_90 and fails on spills.
#include "kiln_cuda_attention.h"

#include "kernels.h"

#include <string.h>

__global__ void __launch_bounds__(KILN_ATTN_THREADS) kt_attention_fwd_kernel(kiln_attention a, const float *q, const float *k, const float *v, float *out, float *lse,
                                                                             float *part, int splits)
{
    kiln_attention_fwd_block(a, q, k, v, out, lse, part, splits);
}

__global__ void __launch_bounds__(KILN_ATTN_THREADS) kt_attention_combine_kernel(kiln_attention a, const float *part, int splits, float *out, float *lse)
{
    kiln_attention_combine_block(a, part, splits, out, lse);
}

template <int PK>
__global__ void __launch_bounds__(KILN_ATTN_THREADS) kt_attention_dkv_kernel(kiln_attention a, const float *q, const float *k, const float *v, const float *out,
                                                                             const float *lse, const float *dout, float *dk, float *dv, float *dmask)
{
    kiln_attention_dkv_block<PK>(a, q, k, v, out, lse, dout, dk, dv, dmask);
}

__global__ void __launch_bounds__(KILN_ATTN_THREADS) kt_attention_dq_kernel(kiln_attention a, const float *q, const float *k, const float *v, const float *out,
                                                                            const float *lse, const float *dout, float *dq)
{
    kiln_attention_dq_block(a, q, k, v, out, lse, dout, dq);
}

// Device copies of host arrays (NULL stays NULL), copied back by kt_dev_back.
static void *kt_dev(const void *host, size_t bytes)
{
    if (!host) return nullptr;
    void *d = nullptr;
    if (cudaMalloc(&d, bytes ? bytes : 1) != cudaSuccess) return nullptr;
    cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice);
    return d;
}

static void kt_dev_back(void *host, void *dev, size_t bytes)
{
    if (host && dev) cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost);
    cudaFree(dev);
}

extern "C" int kt_attention_splits(const kiln_attention *a) { return kiln_attention_fwd_splits(a, 65536); }

extern "C" int kt_attention(const kiln_attention *desc, const KtAttentionArrays *x)
{
    kiln_attention a = *desc;
    const bool packed = x->q == x->k; /* one array holds q, k and v: one copy */
    float *q = (float *)kt_dev(x->q, x->nq * 4), *k_copy = packed ? nullptr : (float *)kt_dev(x->k, x->nk * 4);
    float *v_copy = packed ? nullptr : (float *)kt_dev(x->v, x->nv * 4);
    const float *k = (packed ? q : k_copy) + x->k_at, *v = (packed ? q : v_copy) + x->v_at;
    void *mask = kt_dev(x->mask, x->mask_bytes);
    float *out = (float *)kt_dev(x->out, x->nout * 4), *lse = (float *)kt_dev(x->lse, x->nlse * 4), *dout = (float *)kt_dev(x->dout, x->nout * 4);
    float *dq = (float *)kt_dev(x->dq, x->nq * 4), *dk = (float *)kt_dev(x->dk, x->nk * 4), *dv = (float *)kt_dev(x->dv, x->nv * 4);
    float *dmask = (float *)kt_dev(x->dmask, x->ndmask * 4);
    a.mask_bool = a.mask == KILN_ATTN_KEEP || a.mask == KILN_ATTN_DROP ? (const uint8_t *)mask : nullptr;
    a.mask_add = a.mask == KILN_ATTN_ADD ? (const float *)mask : nullptr;
    if (!x->dout) { /* the forward, its keys split as a model.cu's step splits them (its partials' room) */
        const int splits = kiln_attention_fwd_splits(&a, 65536);
        float *part = nullptr;
        if (splits > 1 && cudaMalloc((void **)&part, 65536) != cudaSuccess) return -1;
        if (kiln_attention_fwd_blocks(&a))
            KILN_LAUNCH(kt_attention_fwd_kernel, kiln_attention_fwd_blocks(&a) * splits, KILN_ATTN_THREADS, kiln_attention_fwd_smem(&a), 0, a, q, k,
                        v, x->want_out ? out : nullptr, lse, part, splits);
        if (kiln_attention_fwd_blocks(&a) && splits > 1)
            KILN_LAUNCH(kt_attention_combine_kernel, kiln_attention_combine_blocks(&a), KILN_ATTN_THREADS, 0, 0, a, part, splits,
                        x->want_out ? out : nullptr, lse);
        cudaFree(part);
    } else {
        if (kiln_attention_dkv_blocks(&a) && (dk || dv || dmask)) {
            const unsigned blocks = kiln_attention_dkv_blocks(&a);
            const size_t smem = kiln_attention_dkv_smem(&a);
            switch (kiln_attn_kv_pairs(&a)) {
            case 8: KILN_LAUNCH((kt_attention_dkv_kernel<8>), blocks, KILN_ATTN_THREADS, smem, 0, a, q, k, v, out, lse, dout, dk, dv, dmask); break;
            case 16: KILN_LAUNCH((kt_attention_dkv_kernel<16>), blocks, KILN_ATTN_THREADS, smem, 0, a, q, k, v, out, lse, dout, dk, dv, dmask); break;
            default: KILN_LAUNCH((kt_attention_dkv_kernel<32>), blocks, KILN_ATTN_THREADS, smem, 0, a, q, k, v, out, lse, dout, dk, dv, dmask); break;
            }
        }
        if (kiln_attention_fwd_blocks(&a) && dq)
            KILN_LAUNCH(kt_attention_dq_kernel, kiln_attention_fwd_blocks(&a), KILN_ATTN_THREADS, kiln_attention_dq_smem(&a), 0, a, q, k, v, out, lse, dout, dq);
    }
    const int err = (int)cudaDeviceSynchronize();
    cudaFree(q), cudaFree(k_copy), cudaFree(v_copy), cudaFree(mask), cudaFree(dout);
    kt_dev_back(x->out, out, x->nout * 4);
    kt_dev_back(x->lse, lse, x->nlse * 4);
    kt_dev_back(x->dq, dq, x->nq * 4);
    kt_dev_back(x->dk, dk, x->nk * 4);
    kt_dev_back(x->dv, dv, x->nv * 4);
    kt_dev_back(x->dmask, dmask, x->ndmask * 4);
    return err ? err : (int)cudaGetLastError();
}
