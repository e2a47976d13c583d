// driver_api.cu — kernels launched through the emulator's driver API (emu/kemu_driver.h):
// the module a cuda-emu program loads where a GPU program loads NVRTC's CUBIN, its
// functions found by name, launched with an array of pointers to the arguments or with one
// buffer. tests/test_cuda_emu.c drives them from C, as the generated host code will.
// Emulator-only: the module image is the emulator's table of the kernels compiled here.
#include "kiln_cuda.h"

#include "kernels.h"

// y[i] = a x[i] + y[i] over n elements, a grid-stride loop (4 parameters: 4, 4, 8, 8 bytes,
// 24 in a launch's buffer).
__global__ void kt_drv_axpy(int n, float a, const float *x, float *y)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) y[i] = a * x[i] + y[i];
}

// y[i] = v for i < n (a template: its instance's name is "kt_drv_fill<double>").
template <typename T> __global__ void kt_drv_fill(T *y, T v, int n)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) y[i] = v;
}

static const kemu_kernel kt_drv_kernels[] = {
    kemu::kernel_entry(kt_drv_axpy, "kt_drv_axpy"),
    kemu::kernel_entry(kt_drv_fill<double>, "kt_drv_fill<double>"),
};

static const kemu_module_image kt_drv_image = {{'K', 'E', 'M', 'U', 'M', 'O', 'D', '1'}, 2, kt_drv_kernels};

extern "C" const void *kt_driver_image(void) { return &kt_drv_image; }
