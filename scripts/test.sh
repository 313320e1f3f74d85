#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit and end-to-end tests on the real models (Rust;
# the KL-divergence tests against the peer, llama.cpp, which scripts/build-peer.sh builds once),
# the quantization kernels again on emulated aarch64 (NEON, NEON dotprod; scripts/test-aarch64.sh),
# the static amd64/arm64 binaries the packages ship (scripts/build-static.sh), the OCI image
# archive (scripts/build-image.sh: it adds the arm64 glibc `cuda` build), then the
# end-to-end tests: HTTP with the official OpenAI Python client, curl and Chromium; the systemd
# notify protocol and unit; the static binaries (arm64 under qemu), .debs (lintian) and the
# offline bundle installed into a fresh root with no network; the fault tests and the load
# generator; the OCI image (skopeo, umoci), the deploy/ manifests and a local fleet behind
# HAProxy with Prometheus (docs/fleet.md); the CUDA kernels compiled by NVRTC for sm_87/sm_90
# and checked by ptxas for spills, with the `cuda` build's CPU fallback (scripts/check-kernels.sh; no GPU needed); the CUDA
# backend's device tests on the host CUDA emulator (scripts/check-cuda-emu.sh). Fuzzing is not
# a step: scripts/fuzz.sh (its own nightly, sanitizer-instrumented build, ten minutes on two
# cores before the first input runs) would take the suite past CI's 90 minutes on a slow host.
# First, scripts/test-preflight.sh checks root and free disk and installs every tool the tests
# use (scripts/test-deps.sh; the Python test clients go into the virtual environment
# target/test-venv, whose python runs the end-to-end tests); scripts/check-layers.py checks the
# import order (docs/layers.md), scripts/check-docs.py that docs and comments hold no history
# and that measured figures stand in docs/performance.md alone, and scripts/check-fn-length.py
# that no function outside the tests is over 80 lines. Last, the system Python's packages must
# be those it had at the start: the suite installs none there.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# What the system Python has installed, to compare at the end: a suite that is a good guest on
# a machine leaves the packages other programs there rely on as they were.
system_python_packages() { python3 -m pip freeze --all 2>/dev/null | sort || true; }
system_packages_before="$(system_python_packages)"
system_python_unchanged() {
    local after
    after="$(system_python_packages)"
    if [ "$after" != "$system_packages_before" ]; then
        echo "test.sh: the suite changed the system Python's packages (- before, + after):" >&2
        diff <(echo "$system_packages_before") <(echo "$after") | grep '^[<>]' \
            | sed -e 's/^</  -/' -e 's/^>/  +/' >&2
        return 1
    fi
}

# Each step's wall time goes to stderr, so a slow CI run shows where its minutes went.
step() {
    local start=$SECONDS
    "$@"
    echo "test.sh: $((SECONDS - start)) s: $*" >&2
}

step scripts/test-preflight.sh
step packaging/fetch-model.sh
step packaging/fetch-model.sh gemma3
# The suite runs llama-perplexity (the KL-divergence and perplexity tests), llama-embedding
# (tests/embeddings.rs) and mtmd-embed (tests/vision.rs); the other peer tools are for scripts/compare-peer.sh and
# scripts/reliability.sh, which build them on first use.
step scripts/build-peer.sh llama-perplexity llama-embedding mtmd-embed mtmd-logits
step cargo fmt --check
step scripts/check-layers.py
step scripts/check-docs.py
step scripts/check-fn-length.py
step cargo clippy --release --all-targets -- -D warnings
step cargo clippy --release --features cuda --all-targets -- -D warnings
step cargo test --profile suite -- --test-threads=1
step scripts/test-aarch64.sh
# The static binaries and the image's arm64 `cuda` build with the `suite` profile too (the same
# code as `release`, without its one-unit, link-time-optimised build on a single core); the
# arm64 one in scripts/test-aarch64.sh's target dir, whose dependencies are built already.
step env EDGELM_BUILD_PROFILE=suite scripts/build-static.sh
arm64_cuda=target/aarch64-cross/aarch64-unknown-linux-gnu/suite/edgelm
step env EDGELM_BUILD_PROFILE=suite CARGO_TARGET_DIR=target/aarch64-cross \
    EDGELM_AMD64_BIN=target/static/amd64/edgelm scripts/build-image.sh
# The HTTP tests run the `suite` build of the binary, which `cargo test` made above for the
# CLI tests: a second, LTO-linked release build would add minutes and test the same code.
step env EDGELM_BINARY=target/suite/edgelm EDGELM_ARM64_BIN="$arm64_cuda" \
    target/test-venv/bin/python -m pytest -q -rs --durations=12 tests/e2e
step scripts/check-kernels.sh
step scripts/check-cuda-emu.sh
step system_python_unchanged
echo "test.sh: all steps passed in $SECONDS s" >&2
