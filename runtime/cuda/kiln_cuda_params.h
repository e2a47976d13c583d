/* kiln_cuda_params.h — a kernel's parameters as CUDA lays them out in a launch's buffer
 * (cuLaunchKernel's CU_LAUNCH_PARAM_BUFFER_POINTER): each at the next multiple of its
 * alignment. The host side of a launch by name packs the arguments so (kiln_cuda.h), the
 * emulator's module unpacks them so (emu/kemu_device.h): one layout for both. C++17. */
#ifndef KILN_CUDA_PARAMS_H
#define KILN_CUDA_PARAMS_H

#include <array>
#include <cstddef>
#include <type_traits>

template <typename... P> struct kiln_cuda_params {
    static constexpr std::size_t n = sizeof...(P);
    static constexpr std::array<std::size_t, n> sizes{{sizeof(typename std::decay<P>::type)...}};
    static constexpr std::array<std::size_t, n> aligns{{alignof(typename std::decay<P>::type)...}};
    static constexpr std::array<std::size_t, n> offsets_()
    {
        std::array<std::size_t, n> o{};
        std::size_t at = 0;
        for (std::size_t i = 0; i < n; i++) {
            at = (at + aligns[i] - 1) / aligns[i] * aligns[i];
            o[i] = at;
            at += sizes[i];
        }
        return o;
    }
    static constexpr std::array<std::size_t, n> offsets = offsets_();
    static constexpr std::size_t bytes = n ? offsets[n ? n - 1 : 0] + sizes[n ? n - 1 : 0] : 0;
};

#endif
