#!/usr/bin/env bash
# The CUDA checks that need a GPU, for a GPU machine that has no Rust toolchain.
#
#   packaging/gpu-check.sh build [DIR]   here (Rust, no GPU): builds the `cuda` edgelm and the
#                                        tests/cuda_kernels.rs test binary, copies both with this
#                                        script and the model into DIR (default target/gpu-check)
#   DIR/gpu-check.sh run                 there (GPU, no Rust): runs every test of that binary,
#                                        the device ones (#[ignore]d elsewhere) included (kernels,
#                                        CUDA-vs-CPU logits, reference greedy outputs, KV pool),
#                                        then `edgelm bench` on the GPU (1 and 16 sequences), and
#                                        writes DIR/report.txt; exits non-zero if any failed
#
# On the GPU machine the kernels compile with the driver's libnvrtc if present, else with one
# from DIR/nvrtc/ (the PyPI wheel that scripts/check-kernels.sh installs, copied by `build`).
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
    mkdir -p "$dir"
    cp "$bin" "$dir/cuda_kernels"
    cp target/release/edgelm "$dir/edgelm"
    cp packaging/gpu-check.sh "$dir/"
    cp models/SmolLM2-135M-Instruct.Q4_1.gguf "$dir/model.gguf"
    mkdir -p "$dir/reference"
    cp ../shared/reference/smollm2-llamacpp.json "$dir/reference/"
    if [ -d target/cuda-wheels/nvidia/cuda_nvrtc/lib ]; then
        cp -a target/cuda-wheels/nvidia/cuda_nvrtc/lib "$dir/nvrtc"
    fi
    echo "gpu-check: $(du -sh "$dir" | cut -f1) in $dir; on the GPU machine: $dir/gpu-check.sh run" >&2
    ;;
run)
    dir="$here"
    cd "$dir"
    report="$dir/report.txt"
    if [ -d "$dir/nvrtc" ]; then
        export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$dir/nvrtc"
    fi
    export EDGELM_BIN="$dir/edgelm" EDGELM_MODEL="$dir/model.gguf"
    export EDGELM_REFERENCE_DIR="$dir/reference"
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
    timeout 150 ./edgelm bench -m "$dir/model.gguf" --backend cuda --concurrency 1,16 \
        --shared-prefix 0 -r 3 2>"$dir/bench.log" | tee -a "$report" || bench=$?
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
    sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
