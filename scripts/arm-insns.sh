#!/usr/bin/env bash
# Arm speed cannot be timed on an x86 host, but the aarch64 instructions a token costs can be
# counted: this runs edgelm and llama.cpp, both built for aarch64, under qemu-aarch64 with a
# TCG plugin that counts executed guest instructions (scripts/qemu-insn-count.c), and prints
# per-token figures for prefill and decode side by side with the ratio edgelm / llama.cpp.
#
#   scripts/arm-insns.sh [-m MODEL.gguf] [-c CPU] [-p LO,HI] [-n LO,HI]
#       -m  the model (default models/SmolLM2-135M-Instruct.Q4_1.gguf)
#       -c  qemu's CPU model, also llama.cpp's -mcpu (default neoverse-n1: the Jetson Orin's
#           level, NEON dotprod, no i8mm; cortex-a72 plain NEON; neoverse-v1, with i8mm,
#           needs qemu 8.1 or later: Debian 12's qemu-user 7.2 lacks it)
#       -p  prompt lengths of the two prefill runs (default 64,128)
#       -n  generated tokens of the two decode runs (default 16,48)
#   EDGELM_SIMD=neon scripts/arm-insns.sh ...   edgelm's plain NEON kernels (passed through)
#
# Every figure is differential, so that loading, packing, tokenizer set-up and warm-up cancel:
# prefill = (instructions with an HI-token prompt - with LO) / (HI - LO), one token generated;
# decode = (instructions generating HI tokens - generating LO) / (HI - LO), 8-token prompt.
# Both engines run one thread (-t 1), as the counting plugin sums all threads into one counter.
# edgelm runs `edgelm run` on a prompt of repeated words (its token count is checked with
# `edgelm tokenize`) with --ignore-eos; llama.cpp runs llama-bench -p N -n 0 / -p 0 -n N
# --no-warmup -r 1 (random tokens). Instruction counts say nothing of memory stalls or of how
# many instructions a core retires per cycle; they compare the work each engine asks for.
#
# Builds what is missing: edgelm for aarch64-unknown-linux-gnu (target/aarch64-unknown-linux-gnu),
# llama.cpp with PEER_FLAVOUR=aarch64-CPU scripts/build-peer.sh llama-bench (target/peer-aarch64-CPU),
# and the plugin (target/qemu-plugin/), against the qemu-plugin.h of the installed qemu-user's
# Debian source (fetched with apt-get source into a private apt state: no apt config changes).
# Writes target/arm-insns.json (one entry per model, CPU and SIMD setting, merged across runs).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

log() { echo "arm-insns: $*" >&2; }
die() { echo "arm-insns: error: $*" >&2; exit 1; }

model="models/SmolLM2-135M-Instruct.Q4_1.gguf"
cpu="neoverse-n1"
prefill_sizes="64,128"
decode_sizes="16,48"
while getopts "m:c:p:n:h" opt; do
    case "$opt" in
        m) model="$OPTARG" ;;
        c) cpu="$OPTARG" ;;
        p) prefill_sizes="$OPTARG" ;;
        n) decode_sizes="$OPTARG" ;;
        *) sed -n '2,/^set -euo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
    esac
done
[ -f "$model" ] || die "no model $model (packaging/fetch-model.sh fetches smollm2 and gemma3)"
IFS=, read -r p_lo p_hi <<<"$prefill_sizes"
IFS=, read -r n_lo n_hi <<<"$decode_sizes"
for v in "$p_lo" "$p_hi" "$n_lo" "$n_hi"; do
    [[ "$v" =~ ^[0-9]+$ ]] || die "-p and -n take two numbers, LO,HI"
done
[ "$p_hi" -gt "$p_lo" ] && [ "$n_hi" -gt "$n_lo" ] || die "-p and -n need LO < HI"

# shellcheck source=scripts/aarch64-toolchain.sh
. "$root/scripts/aarch64-toolchain.sh"
aarch64_install c++
aarch64_rust
command -v gcc >/dev/null || die "no host gcc to compile the qemu plugin"
# qemu 7.2 (Debian 12) knows neoverse-n1 and cortex-a72 but not neoverse-v1 (qemu 8.1+).
# (`-cpu help` exits 1 after listing them, hence the || true.)
cpu_models="$(qemu-aarch64 -cpu help 2>&1 | awk 'NR > 1 { print $1 }' || true)"
grep -qx -- "$cpu" <<<"$cpu_models" \
    || die "this qemu-aarch64 ($(qemu-aarch64 --version | head -1)) has no CPU model $cpu (qemu-aarch64 -cpu help)"

work="$root/target/arm-insns"
mkdir -p "$work"

# --- the counting plugin ---------------------------------------------------------------------
# Debian's qemu-user ships no plugins and no qemu-plugin.h, and the header must match the qemu
# that loads the plugin (its API version), so it comes from that exact version's source.
plugin_dir="$root/target/qemu-plugin"
qemu_version="$(dpkg-query -W -f='${source:Version}' qemu-user 2>/dev/null || true)"
header_dir="$plugin_dir/include-${qemu_version//[:+~]/_}"
plugin="$plugin_dir/libinsncount-${qemu_version//[:+~]/_}.so"
find_header() {
    local d
    for d in "$header_dir" /usr/include /usr/include/qemu /usr/local/include /usr/local/include/qemu; do
        [ -f "$d/qemu-plugin.h" ] && { echo "$d"; return 0; }
    done
    return 1
}
if [ ! -f "$plugin" ] || [ "$plugin" -ot scripts/qemu-insn-count.c ]; then
    if ! inc="$(find_header)"; then
        [ -n "$qemu_version" ] || die "qemu-user is not a Debian package here: put qemu-plugin.h in $header_dir"
        log "fetching qemu $qemu_version's source (for qemu-plugin.h) with apt-get source"
        apt_dir="$plugin_dir/apt"
        rm -rf "$apt_dir"
        mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$apt_dir/parts" "$apt_dir/src"
        touch "$apt_dir/none.list"
        # This machine's Debian mirrors, as source entries, in a private apt state: the system's
        # sources and package lists stay as they are.
        for f in /etc/apt/sources.list.d/*.sources; do
            [ -f "$f" ] && sed 's/^Types:.*/Types: deb-src/' "$f" >"$apt_dir/parts/$(basename "$f")"
        done
        if [ -f /etc/apt/sources.list ]; then
            sed -n 's/^deb /deb-src /p' /etc/apt/sources.list >"$apt_dir/parts/main.list"
        fi
        # Sandbox::User=root: the private cache is root's, which apt's _apt user cannot write.
        apt_opts=(-o Dir::Etc::SourceList="$apt_dir/none.list" -o Dir::Etc::SourceParts="$apt_dir/parts"
            -o Dir::State::Lists="$apt_dir/lists" -o Dir::Cache="$apt_dir/cache" -o APT::Sandbox::User=root)
        apt-get -qq "${apt_opts[@]}" update || die "apt-get update (source lists) failed"
        (cd "$apt_dir/src" && apt-get -qq "${apt_opts[@]}" source --download-only "qemu=$qemu_version" >&2) \
            || die "apt-get source qemu=$qemu_version failed"
        orig="$(ls "$apt_dir"/src/qemu_*.orig.tar.* 2>/dev/null | head -1)"
        [ -n "$orig" ] || die "no qemu orig tarball from apt-get source"
        mkdir -p "$header_dir"
        tar -xf "$orig" -C "$apt_dir/src" --wildcards '*/include/qemu/qemu-plugin.h' \
            || die "no include/qemu/qemu-plugin.h in $(basename "$orig")"
        cp "$apt_dir"/src/*/include/qemu/qemu-plugin.h "$header_dir/"
        rm -rf "$apt_dir"
        inc="$header_dir"
    fi
    log "compiling the counting plugin against $inc/qemu-plugin.h"
    gcc -shared -fPIC -O2 -Wall -I "$inc" -o "$plugin" scripts/qemu-insn-count.c \
        || die "the plugin did not compile against $inc/qemu-plugin.h"
fi

# --- the two engines, built for aarch64 --------------------------------------------------------
edgelm="$root/target/$aarch64_triple/release/edgelm"
log "cargo build --release --target $aarch64_triple"
cargo build --quiet --release --target "$aarch64_triple" || die "the aarch64 edgelm build failed"
PEER_FLAVOUR="aarch64-$cpu" scripts/build-peer.sh llama-bench
peer="$root/target/peer-aarch64-$cpu/build/bin/llama-bench"
[ -x "$peer" ] || die "no $peer"

# --- counting --------------------------------------------------------------------------------
qemu=(qemu-aarch64 -cpu "$cpu" -L "$aarch64_sysroot")
# count NAME CMD...: runs CMD under qemu with the plugin; prints the instructions executed.
count() {
    local name="$1" out="$work/$1.count"
    shift
    rm -f "$out"
    local t0=$SECONDS
    "${qemu[@]}" -plugin "$plugin,out=$out" "$@" >"$work/$name.log" 2>&1 \
        || { tail -n 5 "$work/$name.log" >&2; die "$name failed (log: $work/$name.log)"; }
    [ -s "$out" ] || die "$name: the plugin wrote no count"
    log "$name: $(cat "$out") instructions ($((SECONDS - t0)) s)"
    cat "$out"
}
# words N: a prompt of N repeated words, one token each in both models' vocabularies (checked).
words() { local i s=""; for ((i = 0; i < $1; i++)); do s+=" the"; done; echo "${s# }"; }
tokens() {
    "${qemu[@]}" "$edgelm" tokenize -m "$model" "$1" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))' \
        || die "edgelm tokenize failed on $model"
}
n_p_lo="$(tokens "$(words "$p_lo")")"
n_p_hi="$(tokens "$(words "$p_hi")")"
dp=$((n_p_hi - n_p_lo))
[ "$dp" -eq $((p_hi - p_lo)) ] || die "the prompts differ by $dp tokens, not $((p_hi - p_lo)): \" the\" is not one token per word in this vocabulary"

tag="$(basename "$model" .gguf)-$cpu${EDGELM_SIMD:+-$EDGELM_SIMD}"
log "$tag: edgelm"
run_edgelm() { count "$tag-edgelm-$1" "$edgelm" run -m "$model" -t 1 --temp 0 --ignore-eos -p "$2" -n "$3"; }
e_p_lo=$(run_edgelm "p$p_lo" "$(words "$p_lo")" 1)
e_p_hi=$(run_edgelm "p$p_hi" "$(words "$p_hi")" 1)
e_n_lo=$(run_edgelm "n$n_lo" "$(words 8)" "$n_lo")
e_n_hi=$(run_edgelm "n$n_hi" "$(words 8)" "$n_hi")
log "$tag: llama.cpp"
run_peer() { count "$tag-llama-$1" "$peer" -m "$model" -t 1 -r 1 --no-warmup -p "$2" -n "$3"; }
l_p_lo=$(run_peer "p$p_lo" "$p_lo" 0)
l_p_hi=$(run_peer "p$p_hi" "$p_hi" 0)
l_n_lo=$(run_peer "n$n_lo" 0 "$n_lo")
l_n_hi=$(run_peer "n$n_hi" 0 "$n_hi")

# --- report ----------------------------------------------------------------------------------
python3 - "$root/target/arm-insns.json" "$tag" "$model" "$cpu" "${EDGELM_SIMD:-auto}" \
    "$p_lo" "$p_hi" "$n_lo" "$n_hi" \
    "$e_p_lo" "$e_p_hi" "$e_n_lo" "$e_n_hi" "$l_p_lo" "$l_p_hi" "$l_n_lo" "$l_n_hi" <<'PY'
import json, os, sys
path, tag, model, cpu, simd = sys.argv[1:6]
p_lo, p_hi, n_lo, n_hi, e_p_lo, e_p_hi, e_n_lo, e_n_hi, l_p_lo, l_p_hi, l_n_lo, l_n_hi = map(int, sys.argv[6:])
entry = {
    "model": os.path.basename(model), "cpu": cpu, "edgelm_simd": simd, "threads": 1,
    "prefill_tokens": [p_lo, p_hi], "decode_tokens": [n_lo, n_hi],
    "edgelm": {"prefill": (e_p_hi - e_p_lo) / (p_hi - p_lo), "decode": (e_n_hi - e_n_lo) / (n_hi - n_lo),
               "raw": [e_p_lo, e_p_hi, e_n_lo, e_n_hi]},
    "llama.cpp": {"prefill": (l_p_hi - l_p_lo) / (p_hi - p_lo), "decode": (l_n_hi - l_n_lo) / (n_hi - n_lo),
                  "raw": [l_p_lo, l_p_hi, l_n_lo, l_n_hi]},
}
for k in ("prefill", "decode"):
    entry["ratio_" + k] = entry["edgelm"][k] / entry["llama.cpp"][k]
results = {}
if os.path.exists(path):
    try:
        results = json.load(open(path))
    except ValueError:
        results = {}
results[tag] = entry
with open(path, "w") as f:
    json.dump(results, f, indent=2)
print(f"\naarch64 instructions per token under qemu -cpu {cpu}, one thread, {os.path.basename(model)}"
      f"{'' if simd == 'auto' else ', EDGELM_SIMD=' + simd}")
print(f"{'':9} {'edgelm':>14} {'llama.cpp':>14} {'edgelm/llama':>13}")
for k, n in (("prefill", f"{p_lo}->{p_hi}"), ("decode", f"{n_lo}->{n_hi}")):
    e, l = entry["edgelm"][k], entry["llama.cpp"][k]
    print(f"{k:9} {e / 1e6:12.2f} M {l / 1e6:12.2f} M {e / l:13.2f}")
print(f"(written to {path} as {tag!r})")
PY
