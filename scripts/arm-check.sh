#!/usr/bin/env bash
# The Arm timing that an x86 host cannot do: on a real aarch64 machine (a Jetson Orin, a
# Raspberry Pi 5, a Graviton), edgelm against llama.cpp, prefill and decode, on both models.
#
#   scripts/arm-check.sh [-r N] [-t T] [-p N] [-n N]      on the aarch64 machine
#       -r  rounds (default 3): each round runs llama.cpp, edgelm, then edgelm with
#           EDGELM_SIMD=neon (the plain NEON kernels; only where dotprod is present), so a
#           clock or thermal drift touches every engine alike; medians are reported
#       -t  threads (default 2), the same for both engines
#       -p  prompt tokens of the prefill test (default 512: pp512)
#       -n  generated tokens of the decode test (default 128: tg128)
#   scripts/arm-check.sh --rehearse [CPU] [-r N ...]      on an x86 host: the same steps on
#       binaries cross-built for aarch64, run under qemu-aarch64 -cpu CPU (default neoverse-n1),
#       with tiny sizes (-p 16 -n 4 -r 1 unless given), to check the script end to end;
#       ARM_CHECK_QEMU=CPU does the same. Its figures time qemu, not a CPU.
#
# Steps: builds edgelm (cargo build --release) and llama.cpp (scripts/build-peer.sh llama-bench,
# -mcpu=native there; PEER_FLAVOUR=aarch64-CPU when rehearsing), fetches the two models
# (packaging/fetch-model.sh, into EDGELM_MODELS_DIR or models/), prints the CPU's features
# (/proc/cpuinfo: asimddp is dotprod, i8mm, sve), then the rounds: llama-bench -p N -n N -r 1
# and edgelm bench -p N -n N -r 1 --concurrency 1 --shared-prefix 0, both with --json/-o json.
# Writes target/arm-check/report.txt (the table) and target/arm-check/report.json (every run).
# Exits non-zero when a build or a run fails.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

log() { echo "arm-check: $*" >&2; }
die() { echo "arm-check: error: $*" >&2; exit 1; }
usage() { sed -n '2,/^set -euo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//' >&2; exit 2; }

qemu_cpu="${ARM_CHECK_QEMU:-}"
if [ "${1:-}" = "--rehearse" ]; then
    shift
    qemu_cpu="neoverse-n1"
    if [ $# -gt 0 ] && [[ "$1" != -* ]]; then qemu_cpu="$1"; shift; fi
fi
if [ -n "$qemu_cpu" ]; then rounds=1 threads=2 n_prompt=16 n_gen=4; else rounds=3 threads=2 n_prompt=512 n_gen=128; fi
while getopts "r:t:p:n:h" opt; do
    case "$opt" in
        r) rounds="$OPTARG" ;;
        t) threads="$OPTARG" ;;
        p) n_prompt="$OPTARG" ;;
        n) n_gen="$OPTARG" ;;
        *) usage ;;
    esac
done
for v in "$rounds" "$threads" "$n_prompt" "$n_gen"; do
    [[ "$v" =~ ^[1-9][0-9]*$ ]] || die "-r, -t, -p and -n take positive numbers"
done
[ "$n_gen" -ge 2 ] || die "-n must be at least 2 (edgelm bench needs it)"

out="$root/target/arm-check"
mkdir -p "$out"
models_dir="${EDGELM_MODELS_DIR:-$root/models}"

# --- build -----------------------------------------------------------------------------------
# run: the prefix an aarch64 binary runs under (nothing natively, qemu when rehearsing).
if [ -n "$qemu_cpu" ]; then
    # shellcheck source=scripts/aarch64-toolchain.sh
    . "$root/scripts/aarch64-toolchain.sh"
    aarch64_install c++
    aarch64_rust
    run=(qemu-aarch64 -cpu "$qemu_cpu" -L "$aarch64_sysroot")
    log "rehearsal under qemu-aarch64 -cpu $qemu_cpu: the figures time the emulator, not a CPU"
    log "cargo build --release --target $aarch64_triple"
    cargo build --quiet --release --target "$aarch64_triple" || die "the aarch64 edgelm build failed"
    edgelm="$root/target/$aarch64_triple/release/edgelm"
    PEER_FLAVOUR="aarch64-$qemu_cpu" scripts/build-peer.sh llama-bench
    peer="$root/target/peer-aarch64-$qemu_cpu/build/bin/llama-bench"
else
    [ "$(uname -m)" = aarch64 ] || die "this is $(uname -m), not aarch64: use --rehearse [CPU] to rehearse under qemu"
    command -v cargo >/dev/null || die "no cargo: install Rust (rustup) first"
    run=()
    log "cargo build --release"
    cargo build --quiet --release || die "the edgelm build failed"
    edgelm="$root/target/release/edgelm"
    scripts/build-peer.sh llama-bench
    peer="$root/target/peer/build/bin/llama-bench"
fi
[ -x "$edgelm" ] || die "no $edgelm after the build"
[ -x "$peer" ] || die "no $peer after the build"

# --- models ----------------------------------------------------------------------------------
EDGELM_MODELS_DIR="$models_dir" packaging/fetch-model.sh smollm2
EDGELM_MODELS_DIR="$models_dir" packaging/fetch-model.sh gemma3
models=("$models_dir/SmolLM2-135M-Instruct.Q4_1.gguf" "$models_dir/gemma-3-270m-Q4_K_M.gguf")

# --- the CPU ---------------------------------------------------------------------------------
report="$out/report.txt"
{
    echo "# edgelm arm-check, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    if [ -n "$qemu_cpu" ]; then
        echo "rehearsal: qemu-aarch64 -cpu $qemu_cpu on $(uname -m), $(nproc) host cores"
    else
        echo "$(uname -m), $(nproc) cores, $(grep -m1 -E '^(model name|Model)' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //' || true)"
        grep -m1 '^CPU part' /proc/cpuinfo || true
        if [ -r /proc/device-tree/model ]; then echo "board: $(tr -d '\0' </proc/device-tree/model)"; fi
    fi
} | tee "$report"
if [ -n "$qemu_cpu" ]; then
    # qemu-user shows the host's /proc/cpuinfo, so the guest's features come from std's detection.
    aarch64_probe "$out"
    features="$("${run[@]}" "$out/cpu-features")"
    dotprod=0
    grep -q 'present:.* dotprod' <<<"$features" && dotprod=1
else
    features="$(grep -m1 '^Features' /proc/cpuinfo || echo 'Features: (none in /proc/cpuinfo)')"
    dotprod=0
    grep -qw asimddp <<<"$features" && dotprod=1
fi
echo "$features" | tee -a "$report"
variants=(auto)
if [ "$dotprod" -eq 1 ]; then
    variants+=(neon)
else
    echo "no dotprod: edgelm runs its plain NEON kernels already; no EDGELM_SIMD=neon runs" | tee -a "$report"
fi

# --- rounds ----------------------------------------------------------------------------------
# Each run appends one JSON line {model, engine, round, pp, tg} (tokens per second).
runs="$out/runs.jsonl"
: >"$runs"
record() { # MODEL ENGINE ROUND: reads the engine's JSON output on stdin
    python3 -c '
import json, os, sys
model, engine, rnd = sys.argv[1:]
data = json.load(sys.stdin)
if isinstance(data, list):  # llama-bench: one object per test
    pp = next(d["avg_ts"] for d in data if d["n_prompt"] > 0 and d["n_gen"] == 0)
    tg = next(d["avg_ts"] for d in data if d["n_gen"] > 0 and d["n_prompt"] == 0)
else:                       # edgelm bench --json
    pp, tg = data["prefill_tok_s"], data["decode_tok_s"]
print(json.dumps({"model": os.path.basename(model), "engine": engine, "round": int(rnd), "pp": pp, "tg": tg}))
' "$@" >>"$runs"
}
for model in "${models[@]}"; do
    name="$(basename "$model" .gguf)"
    for ((r = 1; r <= rounds; r++)); do
        log "$name round $r/$rounds: llama.cpp"
        "${run[@]}" "$peer" -m "$model" -t "$threads" -r 1 -p "$n_prompt" -n "$n_gen" -o json \
            2>"$out/$name-llama-$r.log" | record "$model" llama.cpp "$r" \
            || die "llama-bench failed on $name (log: $out/$name-llama-$r.log)"
        for v in "${variants[@]}"; do
            engine="edgelm"
            [ "$v" = auto ] || engine="edgelm-$v"
            log "$name round $r/$rounds: $engine"
            # The caller's EDGELM_SIMD is dropped, so that "edgelm" is always the fastest
            # kernels this CPU has and "edgelm-neon" the forced lower level.
            simd=()
            [ "$v" = auto ] || simd=("EDGELM_SIMD=$v")
            env -u EDGELM_SIMD "${simd[@]}" \
                "${run[@]}" "$edgelm" bench -m "$model" -t "$threads" -r 1 -p "$n_prompt" -n "$n_gen" \
                --concurrency 1 --shared-prefix 0 --json 2>"$out/$name-$engine-$r.log" \
                | record "$model" "$engine" "$r" \
                || die "edgelm bench ($engine) failed on $name (log: $out/$name-$engine-$r.log)"
        done
    done
done

# --- report ----------------------------------------------------------------------------------
python3 - "$runs" "$out/report.json" "$n_prompt" "$n_gen" "$threads" "$rounds" <<'PY' | tee -a "$report"
import json, statistics, sys
runs_path, json_path, n_prompt, n_gen, threads, rounds = sys.argv[1:]
runs = [json.loads(l) for l in open(runs_path)]
models = list(dict.fromkeys(r["model"] for r in runs))
engines = list(dict.fromkeys(r["engine"] for r in runs))
med = {}
for m in models:
    for e in engines:
        sel = [r for r in runs if r["model"] == m and r["engine"] == e]
        if sel:
            med[m, e] = {k: statistics.median(r[k] for r in sel) for k in ("pp", "tg")}
print(f"\nmedians of {rounds} round(s), {threads} threads, tokens/s (ratio: engine / llama.cpp)")
for m in models:
    print(f"\n{m}")
    print(f"  {'engine':14} {'pp' + n_prompt:>10} {'ratio':>6} {'tg' + n_gen:>10} {'ratio':>6}")
    base = med[m, "llama.cpp"]
    for e in engines:
        x = med[m, e]
        print(f"  {e:14} {x['pp']:10.2f} {x['pp'] / base['pp']:6.2f} {x['tg']:10.2f} {x['tg'] / base['tg']:6.2f}")
json.dump({"n_prompt": int(n_prompt), "n_gen": int(n_gen), "threads": int(threads), "rounds": int(rounds),
           "medians": [{"model": m, "engine": e, **med[m, e]} for (m, e) in med], "runs": runs},
          open(json_path, "w"), indent=2)
PY
log "report: $report ($out/report.json)"
