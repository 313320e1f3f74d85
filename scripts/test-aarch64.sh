#!/usr/bin/env bash
# The aarch64 (Jetson) checks, on an x86 host: cross-builds the library's unit tests for
# aarch64-unknown-linux-gnu with the `cuda` feature (Debian's cross gcc links; no dependency
# compiles C, as Cargo.lock has no `cc` crate; cudarc loads libcuda/libnvrtc at run time, so
# the cuda build needs nothing CUDA here) and runs the `quant::` tests under qemu-user, once
# per emulated CPU model in EDGELM_QEMU_CPUS (default "max neoverse-n1 neoverse-v1
# cortex-a72"): `max` has every extension qemu knows (NEON dotprod, i8mm, SVE2, ...);
# neoverse-n1 is the closest model to the Jetson Orin's Cortex-A78AE (NEON dotprod and fp16, no
# i8mm, no SVE); neoverse-v1 adds i8mm and SVE (qemu 8.1 and later: where the installed
# qemu-user is older, Debian 13's is fetched for it, `aarch64_qemu_for`); cortex-a72 has plain
# NEON only, so the kernels chosen at run time without dotprod are covered too. On each, the
# packed-weight test (`arm_packed_products_...`) runs once more to show which levels it
# checked: every level whose feature the CPU reports must be among them (PACKED_LEVELS below).
# The same binary then runs the `backend::cuda::` tests once (kernel list, PTX cache, launch shapes), and
# `cargo clippy --features cuda --all-targets` lints the aarch64 cuda build (the Jetson's
# target; EDGELM_AARCH64_CLIPPY=0 skips it). The tests take about a second per CPU under
# emulation; the cross-build is the slow part.
# Installs the rustup target and the apt packages when absent. Exits non-zero when a test fails
# or when no quant test ran, or when a packed Arm level was not checked on a CPU that has its
# feature.
#
# The build goes to target/aarch64-cross/ (CARGO_TARGET_DIR overrides), so it never waits on
# or invalidates the native build in target/.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

cpus="${EDGELM_QEMU_CPUS:-max neoverse-n1 neoverse-v1 cortex-a72}"
# The packed-weight kernel levels, each as "feature:level": the level the test must report as
# checked on every CPU whose runtime detection sees the feature (plain NEON: every CPU).
PACKED_LEVELS="neon:neon dotprod:neon-dotprod i8mm:neon-i8mm"
packed_test="quant::gemm::tests::arm_packed_products_match_per_pair_dots_bit_for_bit"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target/aarch64-cross}"

log() { echo "test-aarch64: $*" >&2; }

# --- toolchain -----------------------------------------------------------------------------
# shellcheck source=scripts/aarch64-toolchain.sh
. "$root/scripts/aarch64-toolchain.sh"
aarch64_install
aarch64_rust
unset EDGELM_SIMD # the tests must see the NEON kernels, not the forced scalar path

# --- what the emulated CPU reports -----------------------------------------------------------
aarch64_probe "$CARGO_TARGET_DIR"
probe="$CARGO_TARGET_DIR/cpu-features"

# Build once, then run the same test binary under each CPU model (the cargo runner in
# .cargo/config.toml does the same for a plain `cargo test --target aarch64-unknown-linux-gnu`).
# With `--features cuda`: one cross-build covers the quant kernels and the cuda feature.
log "cargo test --profile suite --target $aarch64_triple --features cuda --lib --no-run"
bin="$(cargo test --profile suite --target "$aarch64_triple" --features cuda --lib --no-run \
    --message-format=json-render-diagnostics \
    | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["lib"]:
        print(m["executable"])
')"
[ -n "$bin" ] && [ -x "$bin" ] || { log "FAILED: no test binary from the cross-build"; exit 1; }

out="$(mktemp)"
trap 'rm -f "$out"' EXIT
failed=()

# Runs the packed-weight test alone under qemu $1 on CPU model $2 (whose features are the
# probe's line $3) and fails the CPU unless it reports every level PACKED_LEVELS expects there.
check_packed_levels() {
    local qemu="$1" cpu="$2" present="$3" levels spec feature level
    set +e
    levels="$("$qemu" -cpu "$cpu" -L "$aarch64_sysroot" "$bin" "$packed_test" --exact --nocapture 2>&1)"
    set -e
    for spec in $PACKED_LEVELS; do
        feature="${spec%%:*}" level="${spec#*:}"
        [[ " ${present#*present:} " == *" $feature "* ]] || continue
        if grep -qx "packed level checked: $level" <<<"$levels"; then
            log "ok: packed kernels checked at level $level on -cpu $cpu"
        else
            log "FAILED: -cpu $cpu has $feature but the packed test did not check level $level"
            failed+=("$cpu:$level")
        fi
    done
}
for cpu in $cpus; do
    qemu="$(aarch64_qemu_for "$cpu" "$root/target/qemu-user")" || { failed+=("$cpu"); continue; }
    log "$qemu -cpu $cpu: CPU features seen by the crate's runtime detection"
    "$qemu" -cpu "$cpu" -L "$aarch64_sysroot" "$probe" | tee "$out" >&2
    present="$(grep 'present:' "$out")"
    grep -q "present:.* dotprod" "$out" \
        || log "note: CPU model '$cpu' has no NEON dotprod: this run covers the plain NEON kernels"

    log "${qemu#"$root"/} -cpu $cpu ${bin#"$root"/} quant::"
    set +e
    "$qemu" -cpu "$cpu" -L "$aarch64_sysroot" "$bin" quant:: 2>&1 | tee "$out"
    status=${PIPESTATUS[0]}
    set -e
    ran="$(grep -c '^test quant::.* \.\.\. ok$' "$out" || true)"
    if [ "$status" -ne 0 ]; then
        log "FAILED on -cpu $cpu (the test binary exited $status)"
        failed+=("$cpu")
    elif [ "$ran" -eq 0 ] || ! grep -q '^test result: ok\. [1-9][0-9]* passed' "$out"; then
        log "FAILED: no quant:: test ran on -cpu $cpu"
        failed+=("$cpu")
    else
        log "ok: $ran quant:: tests passed on emulated aarch64 (-cpu $cpu)"
    fi
    check_packed_levels "$qemu" "$cpu" "$present"
done

# The cuda feature's library tests need no GPU (no test here opens libcuda or libnvrtc).
log "qemu-aarch64 -cpu max ${bin#"$root"/} backend::cuda::"
set +e
qemu-aarch64 -cpu max -L "$aarch64_sysroot" "$bin" backend::cuda:: 2>&1 | tee "$out"
status=${PIPESTATUS[0]}
set -e
if [ "$status" -ne 0 ] || ! grep -q '^test result: ok\. [1-9][0-9]* passed' "$out"; then
    log "FAILED: the backend::cuda:: tests on emulated aarch64 (exit $status)"
    failed+=("backend::cuda")
fi

if [ "${EDGELM_AARCH64_CLIPPY:-1}" != 0 ]; then
    log "cargo clippy --target $aarch64_triple --features cuda --all-targets -- -D warnings"
    cargo clippy --quiet --target "$aarch64_triple" --features cuda --all-targets -- -D warnings \
        || failed+=("clippy")
fi

if [ ${#failed[@]} -gt 0 ]; then
    log "FAILED on: ${failed[*]}"
    exit 1
fi
