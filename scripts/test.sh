#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit tests and end-to-end tests on the real model.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

packaging/fetch-model.sh
cargo fmt --check
cargo clippy --release --all-targets -- -D warnings
cargo test --release -- --test-threads=1
