// driver.cpp: the part of the CUDA driver API (libcuda.so.1) that cudarc and edgelm's CUDA
// backend call, implemented on the host. "Device" memory is host memory, so a device pointer
// is a host address; modules are PTX from the real NVRTC whose entries are looked up among the
// host-built kernels (runtime.h); every stream operation runs when it is issued, except on a
// stream being captured, where it is recorded into a graph and runs on cuGraphLaunch.
//
// Where the real driver refuses something, this one refuses it too, so that the backend's use
// of the API is checked, not only its kernels: synchronous calls while the thread captures,
// capturing a copy from pageable host memory, PTX for a newer architecture than the device's,
// copies outside an allocation, an unknown kernel, a launch beyond the block limits; and a
// kernel that touches memory past the end of an allocation faults (a guard page follows each).
//
// Environment: EDGELM_EMU_ARCH (compute capability, default 87: Jetson Orin),
// EDGELM_EMU_INTEGRATED (1: report an integrated GPU, as a Jetson does; default 0),
// EDGELM_EMU_MEM_MIB (device memory, default 2048), EDGELM_EMU_THREADS (OS threads per
// launch), EDGELM_EMU_TRACE (1: log every call that fails).
#include "runtime.h"

#include <sys/mman.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <regex>
#include <set>
#include <string>
#include <vector>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
typedef void *CUevent;

enum : int {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_PTX = 218,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712,
    CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED = 713,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901,
    CUDA_ERROR_STREAM_CAPTURE_IMPLICIT = 906,
    CUDA_ERROR_ILLEGAL_STATE = 401,
};

namespace {

struct Op {
    enum Kind { Launch, Copy, Set } kind;
    const emu::Kernel *kernel = nullptr;
    emu::Dim3 grid{}, block{};
    std::vector<std::vector<char>> args; // a launch's argument values, copied when captured
    void *dst = nullptr;
    const void *src = nullptr;
    size_t bytes = 0;
    unsigned char value = 0;
};

struct Graph {
    std::vector<Op> ops;
};

struct Stream {
    bool capturing = false;
    bool invalidated = false;
    Graph *graph = nullptr;
};

struct Module {
    std::string variant;
    std::set<std::string> entries;
};

struct Function {
    const emu::Kernel *kernel;
    int param_count;
};

std::mutex mu; // guards the maps below (kernels run outside it)
std::map<uintptr_t, size_t> allocations;
std::map<uintptr_t, std::pair<char *, size_t>> mappings; // allocation -> its mmap (base, length)
std::map<uintptr_t, size_t> registered; // page-locked host ranges
size_t used_bytes = 0;
bool initialized = false;
int context_token;
thread_local Stream *capturing_here = nullptr; // the stream this thread captures into

int env_int(const char *name, int fallback) {
    const char *v = std::getenv(name);
    return v && *v ? std::atoi(v) : fallback;
}

int arch() { return env_int("EDGELM_EMU_ARCH", 87); }
size_t total_bytes() { return (size_t)env_int("EDGELM_EMU_MEM_MIB", 2048) << 20; }

CUresult fail(CUresult r, const char *fmt, ...) {
    if (env_int("EDGELM_EMU_TRACE", 0)) {
        va_list ap;
        va_start(ap, fmt);
        std::fprintf(stderr, "cuda-emu: error %d: ", r);
        std::vfprintf(stderr, fmt, ap);
        std::fprintf(stderr, "\n");
        va_end(ap);
    }
    return r;
}

bool in_map(const std::map<uintptr_t, size_t> &m, uintptr_t p, size_t n) {
    auto it = m.upper_bound(p);
    if (it == m.begin()) return false;
    --it;
    return p >= it->first && p + n <= it->first + it->second;
}

// Device memory the kernels may touch: an allocation, or a registered (device-mapped) range.
bool device_range(CUdeviceptr p, size_t n) {
    std::lock_guard<std::mutex> g(mu);
    return in_map(allocations, p, n) || in_map(registered, p, n);
}

bool pinned(const void *p, size_t n) {
    std::lock_guard<std::mutex> g(mu);
    return in_map(registered, (uintptr_t)p, n);
}

// A synchronous call while this thread captures: the real driver refuses it and invalidates
// the capture (thread-local and global modes).
bool refuse_while_capturing() {
    if (!capturing_here) return false;
    capturing_here->invalidated = true;
    return true;
}

void run(const Op &op, void **params) {
    switch (op.kind) {
    case Op::Launch:
        emu::launch(*op.kernel, op.grid, op.block, params);
        break;
    case Op::Copy:
        std::memmove(op.dst, op.src, op.bytes);
        break;
    case Op::Set:
        std::memset(op.dst, op.value, op.bytes);
        break;
    }
}

void replay(const Op &op) {
    std::vector<void *> params;
    for (auto &a : op.args) params.push_back((void *)a.data());
    run(op, params.data());
}

Stream *as_stream(void *s) {
    // The legacy and per-thread default streams are handles 0, 1 and 2.
    return (uintptr_t)s <= 2 ? nullptr : (Stream *)s;
}

// Runs `op` now, or records it when `stream` is being captured.
CUresult issue(void *stream, Op op, void **params) {
    Stream *s = as_stream(stream);
    if (s && s->capturing) {
        if (s->invalidated) return fail(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "capture invalidated");
        if (op.kind == Op::Launch) {
            for (int i = 0; i < op.kernel->param_count; ++i) {
                const char *p = (const char *)params[i];
                op.args.emplace_back(p, p + op.kernel->param_size[i]);
            }
        }
        s->graph->ops.push_back(std::move(op));
        return CUDA_SUCCESS;
    }
    if (capturing_here && !s) return fail(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, "the legacy stream while this thread captures");
    run(op, params);
    return CUDA_SUCCESS;
}

CUresult copy(void *dst, const void *src, size_t n, void *stream, bool host_src, bool host_dst) {
    if (n == 0) return CUDA_SUCCESS;
    if (!host_src && !device_range((CUdeviceptr)src, n))
        return fail(CUDA_ERROR_INVALID_VALUE, "copy from %p (%zu bytes) outside device memory", src, n);
    if (!host_dst && !device_range((CUdeviceptr)dst, n))
        return fail(CUDA_ERROR_INVALID_VALUE, "copy to %p (%zu bytes) outside device memory", dst, n);
    Stream *s = as_stream(stream);
    if (s && s->capturing && ((host_src && !pinned(src, n)) || (host_dst && !pinned(dst, n)))) {
        s->invalidated = true;
        return fail(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "captured copy with pageable host memory");
    }
    Op op{Op::Copy};
    op.dst = dst;
    op.src = src;
    op.bytes = n;
    return issue(stream, std::move(op), nullptr);
}

} // namespace

extern "C" {

CUresult cuInit(unsigned) {
    initialized = true;
    return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int *v) {
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    *v = 12060;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *n) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    *n = 1;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *d, int ordinal) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE;
    *d = 0;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice) {
    std::snprintf(name, len, "edgelm CUDA emulator");
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice) {
    switch (attr) {
    case 75: *v = arch() / 10; break;                            // compute capability major
    case 76: *v = arch() % 10; break;                            // minor
    case 18: *v = env_int("EDGELM_EMU_INTEGRATED", 0); break;   // integrated
    case 19: *v = 1; break;                                      // can map host memory
    case 16: *v = 8; break;                                      // multiprocessors
    case 115: *v = 0; break;                                     // memory pools: no
    case 1: *v = 1024; break;                                    // max threads per block
    case 8: *v = 48 << 10; break;                                // shared memory per block
    case 10: *v = 32; break;                                     // warp size
    default: *v = 0; break;
    }
    return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice) {
    *bytes = total_bytes();
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    *ctx = &context_token;
    return CUDA_SUCCESS;
}
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice) { return CUDA_SUCCESS; }
CUresult cuCtxSetCurrent(CUcontext) { return CUDA_SUCCESS; }
CUresult cuCtxGetCurrent(CUcontext *ctx) {
    *ctx = &context_token;
    return CUDA_SUCCESS;
}
CUresult cuCtxSynchronize() {
    if (refuse_while_capturing()) return fail(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "cuCtxSynchronize while capturing");
    return CUDA_SUCCESS;
}

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
    std::lock_guard<std::mutex> g(mu);
    *total = total_bytes();
    *free_bytes = total_bytes() - used_bytes;
    return CUDA_SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t bytes) {
    if (refuse_while_capturing()) return fail(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "cuMemAlloc while capturing");
    if (bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> g(mu);
    const size_t rounded = (bytes + 255) & ~(size_t)255;
    if (used_bytes + rounded > total_bytes())
        return fail(CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc(%zu): %zu of %zu bytes in use", bytes,
                    used_bytes, total_bytes());
    // The buffer ends where an inaccessible page begins, so a kernel reading or writing past
    // it faults at once (within the 256-byte rounding it does not: nor does a GPU).
    const size_t page = 4096, mapped = (rounded + page - 1) / page * page + page;
    char *base = (char *)mmap(nullptr, mapped, PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    mprotect(base + mapped - page, page, PROT_NONE);
    void *m = base + mapped - page - rounded;
    // Fresh device memory is not zero: reads of memory never written show up as garbage.
    std::memset(m, 0xA5, rounded > (1 << 20) ? (1 << 20) : rounded);
    allocations[(uintptr_t)m] = bytes;
    mappings[(uintptr_t)m] = {base, mapped};
    used_bytes += rounded;
    *p = (CUdeviceptr)m;
    return CUDA_SUCCESS;
}

CUresult cuMemFree_v2(CUdeviceptr p) {
    if (refuse_while_capturing()) return fail(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "cuMemFree while capturing");
    std::lock_guard<std::mutex> g(mu);
    auto it = allocations.find((uintptr_t)p);
    if (it == allocations.end()) return fail(CUDA_ERROR_INVALID_VALUE, "cuMemFree of %llx", p);
    used_bytes -= (it->second + 255) & ~(size_t)255;
    const auto &m = mappings[(uintptr_t)p];
    munmap(m.first, m.second);
    mappings.erase((uintptr_t)p);
    allocations.erase(it);
    return CUDA_SUCCESS;
}

CUresult cuMemHostRegister_v2(void *p, size_t bytes, unsigned) {
    std::lock_guard<std::mutex> g(mu);
    if (in_map(registered, (uintptr_t)p, 1)) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    registered[(uintptr_t)p] = bytes;
    return CUDA_SUCCESS;
}

CUresult cuMemHostUnregister(void *p) {
    std::lock_guard<std::mutex> g(mu);
    if (!registered.erase((uintptr_t)p)) return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    return CUDA_SUCCESS;
}

CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *d, void *p, unsigned) {
    if (!pinned(p, 1)) return fail(CUDA_ERROR_INVALID_VALUE, "device pointer of unregistered %p", p);
    *d = (CUdeviceptr)p;
    return CUDA_SUCCESS;
}

CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) {
    if (refuse_while_capturing()) return fail(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "cuMemsetD8 while capturing");
    if (!device_range(d, n)) return fail(CUDA_ERROR_INVALID_VALUE, "memset outside device memory");
    std::memset((void *)d, v, n);
    return CUDA_SUCCESS;
}

CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, void *stream) {
    if (!device_range(d, n)) return fail(CUDA_ERROR_INVALID_VALUE, "memset outside device memory");
    Op op{Op::Set};
    op.dst = (void *)d;
    op.bytes = n;
    op.value = v;
    return issue(stream, std::move(op), nullptr);
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *h, size_t n) {
    if (refuse_while_capturing()) return fail(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "cuMemcpyHtoD while capturing");
    return copy((void *)d, h, n, nullptr, true, false);
}
CUresult cuMemcpyDtoH_v2(void *h, CUdeviceptr d, size_t n) {
    if (refuse_while_capturing()) return fail(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "cuMemcpyDtoH while capturing");
    return copy(h, (const void *)d, n, nullptr, false, true);
}
CUresult cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n) {
    if (refuse_while_capturing()) return fail(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "cuMemcpyDtoD while capturing");
    return copy((void *)d, (const void *)s, n, nullptr, false, false);
}
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *h, size_t n, void *stream) {
    return copy((void *)d, h, n, stream, true, false);
}
CUresult cuMemcpyDtoHAsync_v2(void *h, CUdeviceptr d, size_t n, void *stream) {
    return copy(h, (const void *)d, n, stream, false, true);
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, void *stream) {
    return copy((void *)d, (const void *)s, n, stream, false, false);
}

CUresult cuStreamCreate(void **s, unsigned) {
    *s = new Stream();
    return CUDA_SUCCESS;
}
CUresult cuStreamCreateWithPriority(void **s, unsigned, int) {
    *s = new Stream();
    return CUDA_SUCCESS;
}
CUresult cuStreamDestroy_v2(void *s) {
    Stream *st = as_stream(s);
    if (st && st->capturing) delete st->graph;
    delete st;
    return CUDA_SUCCESS;
}
CUresult cuStreamSynchronize(void *s) {
    Stream *st = as_stream(s);
    if ((st && st->capturing) || refuse_while_capturing()) {
        if (st) st->invalidated = true;
        return fail(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "cuStreamSynchronize while capturing");
    }
    return CUDA_SUCCESS;
}
CUresult cuStreamQuery(void *) { return CUDA_SUCCESS; }
CUresult cuStreamWaitEvent(void *, CUevent, unsigned) { return CUDA_SUCCESS; }

CUresult cuStreamBeginCapture_v2(void *s, int mode) {
    Stream *st = as_stream(s);
    if (!st) return fail(CUDA_ERROR_ILLEGAL_STATE, "capturing the legacy default stream");
    if (st->capturing) return fail(CUDA_ERROR_ILLEGAL_STATE, "capture already begun");
    st->capturing = true;
    st->invalidated = false;
    st->graph = new Graph();
    if (mode != 2) capturing_here = st; // relaxed mode (2) refuses nothing
    return CUDA_SUCCESS;
}

CUresult cuStreamEndCapture(void *s, void **graph) {
    Stream *st = as_stream(s);
    if (!st || !st->capturing) return fail(CUDA_ERROR_ILLEGAL_STATE, "no capture to end");
    st->capturing = false;
    if (capturing_here == st) capturing_here = nullptr;
    if (st->invalidated) {
        delete st->graph;
        st->graph = nullptr;
        *graph = nullptr;
        return fail(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "the capture was invalidated");
    }
    *graph = st->graph;
    st->graph = nullptr;
    return CUDA_SUCCESS;
}

CUresult cuStreamIsCapturing(void *s, int *status) {
    Stream *st = as_stream(s);
    *status = st && st->capturing ? (st->invalidated ? 2 : 1) : 0;
    return CUDA_SUCCESS;
}

CUresult cuGraphInstantiateWithFlags(void **exec, void *graph, unsigned long long) {
    if (!graph) return CUDA_ERROR_INVALID_VALUE;
    *exec = new Graph(*(Graph *)graph);
    return CUDA_SUCCESS;
}
CUresult cuGraphLaunch(void *exec, void *stream) {
    if (!exec) return CUDA_ERROR_INVALID_HANDLE;
    Stream *st = as_stream(stream);
    if (st && st->capturing) return fail(CUDA_ERROR_NOT_SUPPORTED, "graph launch into a capture");
    for (const Op &op : ((Graph *)exec)->ops) replay(op);
    return CUDA_SUCCESS;
}
CUresult cuGraphUpload(void *, void *) { return CUDA_SUCCESS; }
CUresult cuGraphDestroy(void *g) {
    delete (Graph *)g;
    return CUDA_SUCCESS;
}
CUresult cuGraphExecDestroy(void *g) {
    delete (Graph *)g;
    return CUDA_SUCCESS;
}

CUresult cuEventCreate(CUevent *e, unsigned) {
    *e = new int(0);
    return CUDA_SUCCESS;
}
CUresult cuEventRecord(CUevent, void *) { return CUDA_SUCCESS; }
CUresult cuEventSynchronize(CUevent) { return CUDA_SUCCESS; }
CUresult cuEventQuery(CUevent) { return CUDA_SUCCESS; }
CUresult cuEventDestroy_v2(CUevent e) {
    delete (int *)e;
    return CUDA_SUCCESS;
}
CUresult cuEventElapsedTime(float *ms, CUevent, CUevent) {
    *ms = 0.0f;
    return CUDA_SUCCESS;
}

CUresult cuModuleLoadData(void **module, const void *image) {
    const std::string ptx((const char *)image);
    std::smatch m;
    if (!std::regex_search(ptx, m, std::regex(R"(\.target\s+sm_(\d+))")))
        return fail(CUDA_ERROR_INVALID_PTX, "no .target in the image (not PTX?)");
    if (std::stoi(m[1]) > arch())
        return fail(CUDA_ERROR_INVALID_PTX, "PTX for sm_%s on an sm_%d device", m[1].str().c_str(), arch());
    auto *mod = new Module();
    // The host build of the kernels for this PTX's architecture class (build.sh).
    mod->variant = std::stoi(m[1]) >= 80 ? "sm80:" : "sm61:";
    const std::regex entry(R"(\.entry\s+([A-Za-z_][A-Za-z0-9_]*))");
    for (auto it = std::sregex_iterator(ptx.begin(), ptx.end(), entry); it != std::sregex_iterator(); ++it) {
        const std::string name = (*it)[1];
        if (!emu::find_kernel((mod->variant + name).c_str())) {
            std::fprintf(stderr, "cuda-emu: the PTX defines %s, which has no host build\n", name.c_str());
            delete mod;
            return CUDA_ERROR_INVALID_PTX;
        }
        mod->entries.insert(name);
    }
    *module = mod;
    return CUDA_SUCCESS;
}

CUresult cuModuleUnload(void *module) {
    delete (Module *)module;
    return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(void **f, void *module, const char *name) {
    auto *mod = (Module *)module;
    if (!mod || !mod->entries.count(name)) return fail(CUDA_ERROR_NOT_FOUND, "no kernel %s in the module", name);
    const emu::Kernel *k = emu::find_kernel((mod->variant + name).c_str());
    *f = new Function{k, k->param_count};
    return CUDA_SUCCESS;
}

CUresult cuFuncGetAttribute(int *v, int attr, void *) {
    switch (attr) {
    case 0: *v = 1024; break; // max threads per block
    case 4: *v = 64; break;   // registers
    default: *v = 0; break;
    }
    return CUDA_SUCCESS;
}
CUresult cuFuncSetAttribute(void *, int, int) { return CUDA_SUCCESS; }
CUresult cuFuncSetCacheConfig(void *, int) { return CUDA_SUCCESS; }

CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned shared, void *stream, void **params, void **extra) {
    auto *fn = (Function *)f;
    if (!fn) return CUDA_ERROR_INVALID_HANDLE;
    const char *name = fn->kernel->name;
    if (extra) return fail(CUDA_ERROR_NOT_SUPPORTED, "%s: `extra` launch arguments", name);
    if (!gx || !gy || !gz || !bx || !by || !bz || gy > 65535 || gz > 65535 ||
        (unsigned long long)bx * by * bz > 1024 || bz > 64 || shared > (48u << 10))
        return fail(CUDA_ERROR_INVALID_VALUE, "%s: grid (%u,%u,%u) block (%u,%u,%u) shared %u", name,
                    gx, gy, gz, bx, by, bz, shared);
    if (fn->param_count > 0 && !params) return fail(CUDA_ERROR_INVALID_VALUE, "%s: no arguments", name);
    Op op{Op::Launch};
    op.kernel = fn->kernel;
    op.grid = emu::Dim3{gx, gy, gz};
    op.block = emu::Dim3{bx, by, bz};
    return issue(stream, std::move(op), params);
}

CUresult cuGetErrorName(CUresult e, const char **s) {
    static thread_local char buf[48];
    std::snprintf(buf, sizeof buf, "CUDA_ERROR_%d", e);
    *s = buf;
    return CUDA_SUCCESS;
}
CUresult cuGetErrorString(CUresult e, const char **s) { return cuGetErrorName(e, s); }

} // extern "C"
