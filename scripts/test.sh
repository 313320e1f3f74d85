#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit and end-to-end tests on the real model (Rust),
# the quantization kernels again on emulated aarch64 (NEON, NEON dotprod; scripts/test-aarch64.sh),
# then the HTTP end-to-end tests with the official OpenAI Python client, curl and Chromium.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

packaging/fetch-model.sh
cargo fmt --check
cargo clippy --release --all-targets -- -D warnings
cargo build --release
cargo test --release -- --test-threads=1
scripts/test-aarch64.sh
python3 -m pytest -q tests/e2e
