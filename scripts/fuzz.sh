#!/usr/bin/env bash
# Runs every cargo-fuzz target in fuzz/ for SECONDS each (default 20), starting from the
# checked-in seed corpus, and prints one line per target with its executions count.
# Exits non-zero when any target crashes, hangs (-timeout) or blows its memory limit.
#
#   scripts/fuzz.sh [SECONDS]
#
# Needs the nightly toolchain (cargo-fuzz builds with sanitizer coverage) and, for the
# tokenizer/request/chat targets, the reference model (models/, or EDGELM_FUZZ_MODEL).
# Installs cargo-fuzz when missing. The corpus is copied to target/fuzz-corpus/ first, so
# runs do not dirty fuzz/corpus/; crash inputs land in target/fuzz-artifacts/<target>/.
set -euo pipefail

secs=${1:-20}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
targets=(gguf_parse tokenizer_roundtrip request_json chat_template grammar http_front)

if ! cargo +nightly --version >/dev/null 2>&1; then
    rustup toolchain install nightly --profile minimal
fi
if ! command -v cargo-fuzz >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi
model=${EDGELM_FUZZ_MODEL:-$root/models/SmolLM2-135M-Instruct.Q4_1.gguf}
if [ ! -f "$model" ]; then
    echo "fuzz.sh: reference model $model is missing (packaging/fetch-model.sh, or set EDGELM_FUZZ_MODEL)" >&2
    exit 2
fi
export EDGELM_FUZZ_MODEL=$model

# -a: debug assertions and overflow checks on, so arithmetic slips count as crashes.
(cd fuzz && cargo +nightly fuzz build -a -O)
triple=$(rustc +nightly -vV | sed -n 's/^host: //p')
bindir=$root/fuzz/target/$triple/release

# Runs target $1 for $secs seconds; its one summary line goes to target/fuzz-logs/$1.result.
fuzz_one() {
    local t=$1 corpus=$root/target/fuzz-corpus/$1 artifacts=$root/target/fuzz-artifacts/$1
    local log=$root/target/fuzz-logs/$1.log rc=0 execs
    mkdir -p "$corpus" "$artifacts" "$(dirname "$log")"
    cp -R "fuzz/corpus/$t/." "$corpus/"
    "$bindir/$t" "$corpus" -max_total_time="$secs" -timeout=20 -rss_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix="$artifacts/" >"$log" 2>&1 || rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n1)
    [ -n "$execs" ] || execs=$(sed -n 's/^Done \([0-9]*\) runs.*/\1/p' "$log" | tail -n1)
    if [ "$rc" -eq 0 ]; then
        echo "fuzz $t: ok, ${execs:-?} executions in ${secs}s" >"${log%.log}.result"
    else
        echo "fuzz $t: FAILED (exit $rc) after ${execs:-?} executions; log $log, inputs in $artifacts" \
            >"${log%.log}.result"
        grep -m1 -A6 -E 'panicked at|ERROR: libFuzzer' "$log" >&2 || tail -n 20 "$log" >&2
    fi
}

# Each libFuzzer process is one thread: EDGELM_FUZZ_JOBS of them (default: one per core) run
# side by side.
side_by_side=${EDGELM_FUZZ_JOBS:-$(nproc)}
for t in "${targets[@]}"; do
    rm -f "$root/target/fuzz-logs/$t.result"
    while [ "$(jobs -rp | wc -l)" -ge "$side_by_side" ]; do wait -n || true; done
    fuzz_one "$t" &
done
wait
status=0
summary=()
for t in "${targets[@]}"; do
    line=$(cat "$root/target/fuzz-logs/$t.result" 2>/dev/null || echo "fuzz $t: FAILED (no result)")
    [[ "$line" == *": ok,"* ]] || status=1
    summary+=("$line")
done
printf '%s\n' "${summary[@]}"
exit "$status"
