// invoke.h: calls a kernel with the arguments cuLaunchKernel's `kernelParams` point to, each
// read at the size the kernel declares (as the real driver copies them), and registers it.
#pragma once

#include "runtime.h"

#include <cstddef>
#include <type_traits>
#include <utility>

namespace emu {

template <class F> struct Invoke;

template <class... A> struct Invoke<void (*)(A...)> {
    static_assert(sizeof...(A) <= MAX_PARAMS, "too many kernel arguments");
    template <std::size_t... I>
    static void call(void *fn, void **p, std::index_sequence<I...>) {
        ((void (*)(A...))fn)(*static_cast<std::remove_cv_t<A> *>(p[I])...);
    }
    static void run(void *fn, void **p) { call(fn, p, std::index_sequence_for<A...>{}); }
    static Kernel kernel(const char *name, void *fn) {
        Kernel k{name, &run, fn, (int)sizeof...(A), {}};
        const std::size_t sizes[] = {sizeof(A)..., 0};
        for (std::size_t i = 0; i < sizeof...(A); ++i) k.param_size[i] = sizes[i];
        return k;
    }
};

template <class F> inline void register_as(const char *name, F fn) {
    register_kernel(Invoke<F>::kernel(name, (void *)fn));
}

} // namespace emu
