#!/usr/bin/env bash
# The CUDA backend end to end without a GPU: builds the host CUDA emulator (emu/cuda/: the
# kernels/*.cu sources compiled by g++, and a libcuda.so.1 that runs them) and runs every
# device test of tests/cuda_kernels.rs against it, the ones packaging/gpu-check.sh runs on a
# GPU: kernels and GEMM (MMA and dp4a builds) against the CPU, device sampling, and the forward
# pass (logits against the CPU's, reference greedy outputs, decode graphs, the KV pool), each
# projector type's image encoder against the CPU's, through the real NVRTC and cudarc; then
# `edgelm run` and `edgelm serve` on the device. The forward tests use part of the reference
# data (the emulator takes seconds per forward pass); on a GPU they use all of it.
#
# Needs the NVRTC wheel that scripts/check-kernels.sh installs into target/cuda-wheels/.
# Passing here is not a GPU result: emu/cuda/README.md says what the emulator cannot tell.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
log() { echo "check-cuda-emu: $*" >&2; }

nvrtc_lib="$root/target/cuda-wheels/nvidia/cuda_nvrtc/lib"
[ -d "$nvrtc_lib" ] || { log "FAILED: no NVRTC in $nvrtc_lib (run scripts/check-kernels.sh first)"; exit 1; }
emu="$root/target/cuda-emu"
emu/cuda/build.sh "$emu"
packaging/fetch-model.sh >/dev/null
# The gemma3 test projector's rows are Gemma 3 270M's width.
packaging/fetch-model.sh gemma3 >/dev/null

export LD_LIBRARY_PATH="$emu:$nvrtc_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export EDGELM_CACHE_DIR="$emu/ptx-cache"
# Part of the reference data, to stay within a few minutes on two cores. All of it:
# EDGELM_CUDA_TEST_PROMPTS=12 EDGELM_CUDA_TEST_TOKENS=48 EDGELM_CUDA_TEST_DRAWS=40000 (an hour).
export EDGELM_CUDA_TEST_PROMPTS="${EDGELM_CUDA_TEST_PROMPTS:-2}"
export EDGELM_CUDA_TEST_TOKENS="${EDGELM_CUDA_TEST_TOKENS:-8}"
export EDGELM_CUDA_TEST_DRAWS="${EDGELM_CUDA_TEST_DRAWS:-2000}"
# Every architecture's test model: a 20-token prompt per sequence and 2 decode steps, on its
# first 6 layers (each kind of layer a test model has is among them).
export EDGELM_CUDA_TEST_ARCH_PROMPT="${EDGELM_CUDA_TEST_ARCH_PROMPT:-20}"
export EDGELM_CUDA_TEST_LAYERS="${EDGELM_CUDA_TEST_LAYERS:-6}"
export EDGELM_CUDA_TEST_ARCH_STEPS="${EDGELM_CUDA_TEST_ARCH_STEPS:-2}"

run_tests() {
    cargo test --profile suite --features cuda --test cuda_kernels -- --ignored --test-threads=1 --nocapture "$@"
}

log "device tests against the emulated sm_87 (discrete) device"
run_tests
# The Jetson's way: weights registered and read in place (zero-copy) instead of copied.
log "the forward pass again, the device reporting itself integrated"
EDGELM_EMU_INTEGRATED=1 EDGELM_CUDA_TEST_PROMPTS=1 EDGELM_CUDA_TEST_TOKENS=4 \
    run_tests cuda_logits_match_the_cpu_f16_pages
# Each block's threads run last to first between barriers: a result that changes reads shared
# data another thread writes with no barrier in between.
log "the kernel tests again, threads scheduled in reverse"
EDGELM_EMU_SCHEDULE=reverse EDGELM_CUDA_TEST_DRAWS=500 run_tests device_
# The real binary through the engine (scheduler, CUDA executor, device sampling): with a device
# present, `edgelm run --backend cuda` and `edgelm serve` (over HTTP) must run on it.
log "edgelm run and serve on the emulated device"
cargo test --profile suite --features cuda --test cuda_kernels -- --test-threads=1 --nocapture cuda_build_
log "ok: every device test passed on the emulated device (not a GPU result)"
