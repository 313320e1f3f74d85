#!/usr/bin/env bash
# The CUDA checks that need a GPU, for a GPU machine that has no Rust toolchain.
#
#   packaging/gpu-check.sh build [DIR]   here (Rust, no GPU): builds the `cuda` edgelm and the
#                                        tests/cuda_kernels.rs test binary and lays them out
#                                        with this script, the model and the reference outputs
#                                        in DIR (default target/gpu-check), in two halves a/
#                                        and b/ of under 64 MiB each (see below)
#   DIR/b/gpu-check.sh run               there (GPU, no Rust): runs every test of that binary,
#                                        the device ones (#[ignore]d elsewhere) included (kernels,
#                                        CUDA-vs-CPU logits, every architecture's test model made
#                                        there from the model, reference greedy outputs, KV pool),
#                                        then `edgelm bench` on the GPU (1 and 16 sequences), and
#                                        writes DIR/b/report.txt; exits non-zero if any failed
#
# Why two halves: the lent GPU machine reaches no network, and one call carries at most 64 MiB
# of files; the model alone is 94 MB. So one call carries a/ (the model's first 56 MiB) and
# returns at once, the next carries b/ (the rest, the binaries stripped, the reference data)
# and runs; ignored files stay on the machine between calls while it is held:
#   run(carry=["target/gpu-check/a"], command="ls -l target/gpu-check/a", timeout_s=60)
#   run(carry=["target/gpu-check/b"], command="target/gpu-check/b/gpu-check.sh run;
#       rc=$?; cp target/gpu-check/b/report.txt $OUT/; exit $rc", timeout_s=540)
# A machine with room for the whole (or the model already there) needs only the second call.
#
# libnvrtc: `run` uses one the loader finds (libnvrtc.so or libnvrtc.so.12), else DIR/nvrtc/
# (`build` copies the PyPI wheel's there only with GPU_CHECK_NVRTC=1: 62 MB), else the first
# libnvrtc.so.* found under /usr/local/cuda*, /usr/lib and /opt (e.g. the CUDA 13 one that
# the lent machine's Python packages hold), linked as DIR/b/nvrtc/libnvrtc.so.
set -euo pipefail
cmd="${1:-}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

case "$cmd" in
build)
    root="$(cd "$here/.." && pwd)"
    dir="${2:-$root/target/gpu-check}"
    cd "$root"
    packaging/fetch-model.sh
    bin="$(cargo test --release --features cuda --test cuda_kernels --no-run \
        --message-format=json-render-diagnostics | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "cuda_kernels":
        print(m["executable"])
')"
    [ -x "$bin" ] || { echo "gpu-check: no test binary" >&2; exit 1; }
    rm -rf "$dir"
    mkdir -p "$dir/a" "$dir/b/reference"
    strip -o "$dir/b/cuda_kernels" "$bin"
    strip -o "$dir/b/edgelm" target/release/edgelm
    cp packaging/gpu-check.sh "$dir/b/"
    model=models/SmolLM2-135M-Instruct.Q4_1.gguf
    head -c $((56 << 20)) "$model" >"$dir/a/model.part0"
    tail -c +$(((56 << 20) + 1)) "$model" >"$dir/b/model.part1"
    sha256sum "$model" | cut -d' ' -f1 >"$dir/b/model.sha256"
    cp tests/data/smollm2-llamacpp.json "$dir/b/reference/"
    if [ "${GPU_CHECK_NVRTC:-0}" = 1 ] && [ -d target/cuda-wheels/nvidia/cuda_nvrtc/lib ]; then
        cp -a target/cuda-wheels/nvidia/cuda_nvrtc/lib "$dir/b/nvrtc"
    fi
    for half in a b; do
        size=$(du -sb "$dir/$half" | cut -f1)
        [ "$size" -lt $((60 << 20)) ] || { echo "gpu-check: $dir/$half is $size bytes" >&2; exit 1; }
    done
    echo "gpu-check: $(du -sh "$dir/a" | cut -f1) in $dir/a, $(du -sh "$dir/b" | cut -f1) in $dir/b;" \
        "on the GPU machine: $dir/b/gpu-check.sh run" >&2
    ;;
run)
    dir="$here"
    cd "$dir"
    report="$dir/report.txt"
    if [ ! -f model.gguf ]; then
        [ -f ../a/model.part0 ] || { echo "gpu-check: no ../a/model.part0 (carry a/ first)" >&2; exit 1; }
        cat ../a/model.part0 model.part1 >model.gguf
    fi
    [ "$(sha256sum model.gguf | cut -d' ' -f1)" = "$(cat model.sha256)" ] ||
        { echo "gpu-check: model.gguf is not the model built with (sha256)" >&2; exit 1; }
    if ! ldconfig -p 2>/dev/null | grep -qE 'libnvrtc\.so(\.12)? ' && [ ! -d "$dir/nvrtc" ]; then
        found="$(find /usr/local/cuda* /usr/lib /opt -name 'libnvrtc.so*' 2>/dev/null |
            grep -v builtins | sort | head -1 || true)"
        if [ -n "$found" ]; then
            mkdir -p "$dir/nvrtc"
            ln -sf "$found" "$dir/nvrtc/libnvrtc.so"
            # Its builtins library is looked up beside it.
            export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$(dirname "$found")"
            echo "gpu-check: libnvrtc from $found" >&2
        fi
    fi
    if [ -d "$dir/nvrtc" ]; then
        export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$dir/nvrtc"
    fi
    export EDGELM_BIN="$dir/edgelm" EDGELM_MODEL="$dir/model.gguf"
    export EDGELM_REFERENCE_DIR="$dir/reference" EDGELM_TEST_MODELS="$dir/test-models"
    export EDGELM_CACHE_DIR="$dir/ptx-cache" RUST_LOG="${RUST_LOG:-info}"
    {
        echo "# edgelm gpu-check, $(date -u +%Y-%m-%dT%H:%M:%SZ), $(uname -m)"
        command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap \
            --format=csv,noheader || echo "nvidia-smi: not available"
        echo
    } >"$report"
    status=0
    # --include-ignored: the compile-only tests and the device tests, each reported as it is.
    # Bounded so that tests and bench together stay within 8 minutes.
    timeout 300 ./cuda_kernels --include-ignored --test-threads=1 --nocapture 2>&1 | tee -a "$report" \
        || status=$?
    tests_ok=0
    if grep -q '^test result: ok\. [1-9][0-9]* passed' "$report" && [ "$status" -eq 0 ]; then
        tests_ok=1
    fi
    # Throughput on the GPU: prefill, one sequence's decode, 16 sequences' aggregate decode.
    {
        echo
        echo "## edgelm bench --backend cuda (1 and 16 sequences)"
    } >>"$report"
    bench=0
    # GPU_CHECK_BENCH replaces the bench arguments (a rehearsal on emu/cuda uses a tiny one).
    read -r -a bench_args <<<"${GPU_CHECK_BENCH:---concurrency 1,16 --shared-prefix 0 -r 3}"
    timeout 150 ./edgelm bench -m "$dir/model.gguf" --backend cuda "${bench_args[@]}" \
        2>"$dir/bench.log" | tee -a "$report" || bench=$?
    # Which backend the figures are from (the engine's start-up lines).
    grep -E 'CUDA|on the CPU|KV pool' "$dir/bench.log" | tr '\r' '\n' | grep -E 'CUDA|CPU|KV' \
        >>"$report" || true
    if [ "$bench" -ne 0 ]; then
        echo "edgelm bench failed or timed out (exit $bench)" | tee -a "$report"
    fi
    if [ "$tests_ok" -eq 1 ] && [ "$bench" -eq 0 ]; then
        echo "gpu-check: PASSED (report: $report)" | tee -a "$report"
    else
        echo "gpu-check: FAILED (report: $report)" | tee -a "$report"
        exit 1
    fi
    ;;
*)
    sed -n '2,/^set -euo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
