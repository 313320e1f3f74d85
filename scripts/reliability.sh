#!/usr/bin/env bash
# Reliability figures for docs/performance.md (its Reliability section), measured with
# `edgelm loadgen` against the real server:
#   1. capacity: a closed loop of 8 clients on the mixed workload; the sustainable rate is
#      70% of the requests per second it completes;
#   2. soak at the sustainable rate (SOAK seconds, default 600): failed requests, leaked KV
#      blocks, RSS growth after warm-up, descriptors and threads, p99 TTFT;
#   3. overload at 3x that rate for 90 s: 429s (with Retry-After), never 5xx, and how long
#      after the load stops a probe sees the soak's p50 TTFT again;
#   4. head-of-line: 8 greedy streams decode while 4 prompts of 4,000 tokens arrive; their
#      inter-token latency before and during, on edgelm and on llama-server side by side.
#
#   scripts/reliability.sh [-d SOAK_SECONDS] [-t THREADS] [-s (skip llama-server)] [-H (skip head-of-line)]
#   (RELIABILITY_CAPACITY_S and RELIABILITY_OVERLOAD_S shorten steps 1 and 3 for a quick try.
#   RELIABILITY_RATE=R skips step 1 and soaks at R req/s, overloading at 3R: two builds compared
#   side by side then face the same load, not each its own noisy capacity figure.)
#
# A benchmark, not a test: it prints the figures and writes target/reliability/summary.json;
# it exits non-zero only when something could not run. Run it on an otherwise idle machine.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

soak=600
threads=2
peer=1
hol=1
cap_s=${RELIABILITY_CAPACITY_S:-120}
over_s=${RELIABILITY_OVERLOAD_S:-90}
while getopts "d:t:sHh" opt; do
    case "$opt" in
        d) soak="$OPTARG" ;;
        t) threads="$OPTARG" ;;
        s) peer=0 ;;
        H) hol=0 peer=0 ;;
        *) echo "usage: $0 [-d SOAK_SECONDS] [-t THREADS] [-s]" >&2; exit 2 ;;
    esac
done
model="models/SmolLM2-135M-Instruct.Q4_1.gguf"
out="$root/target/reliability"
edgelm="$root/target/release/edgelm"
# RELIABILITY_SERVER: serve with another build (an older one, to compare side by side); the
# load generator stays this tree's.
server="${RELIABILITY_SERVER:-$edgelm}"
port=18181
log() { echo "reliability: $*" >&2; }

[ -f "$model" ] || packaging/fetch-model.sh
cargo build --release --quiet
[ "$peer" = 0 ] || scripts/build-peer.sh llama-server
mkdir -p "$out"
rm -f "$out"/*.json

pid=""
wait_ready() {
    for _ in $(seq 1 600); do
        curl -fs "http://127.0.0.1:$port/health" >/dev/null 2>&1 && return 0
        kill -0 "$pid" 2>/dev/null || { log "server died at start (see $1)"; exit 1; }
        sleep 0.1
    done
    log "server not ready after 60 s"; exit 1
}
start_edgelm() { # name
    "$server" serve -m "$model" --port "$port" -t "$threads" --kv-memory-mib 768 \
        >"$out/$1.log" 2>&1 &
    pid=$!
    wait_ready "$out/$1.log"
}
stop_server() { # name
    kill -TERM "$pid"
    local rc=0
    wait "$pid" || rc=$?
    echo "$rc" >"$out/$1.exit"
    pid=""
}
trap '[ -z "$pid" ] || kill -9 "$pid" 2>/dev/null || true' EXIT
lg() { "$edgelm" loadgen --url "http://127.0.0.1:$port" "$@"; }
field() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2], {}, d))" "$@"; }

start_edgelm edgelm-soak
if [ -n "${RELIABILITY_RATE:-}" ]; then
    rate=$RELIABILITY_RATE
    log "1/4 capacity skipped: sustainable rate $rate req/s (RELIABILITY_RATE)"
else
    log "1/4 capacity (closed loop, 8 clients, $cap_s s)"
    lg --concurrency 8 --duration "$cap_s" --json "$out/capacity.json"
    capacity=$(field "$out/capacity.json" "(report['ok'] + report['disconnected']) / report['duration_s']")
    rate=$(python3 -c "print(round(0.7 * $capacity, 3))")
    log "capacity $capacity req/s; sustainable rate $rate req/s"
fi

log "2/4 soak at $rate req/s for $soak s"
lg --rate "$rate" --duration "$soak" --seed 2 --pid "$pid" --warmup 60 --json "$out/soak.json"
normal=$(field "$out/soak.json" "report['ttft']['p50']")

overload=$(python3 -c "print(round(3 * $rate, 3))")
log "3/4 overload at $overload req/s for $over_s s, then recovery to the soak's p50 TTFT ($normal s)"
lg --rate "$overload" --duration "$over_s" --seed 3 --recovery --normal-ttft "$normal" --json "$out/overload.json"
stop_server edgelm-soak

if [ "$hol" = 1 ]; then
    log "4/4 head-of-line on edgelm"
    start_edgelm edgelm-hol
    lg --scenario hol --json "$out/hol-edgelm.json"
    stop_server edgelm-hol
fi
if [ "$peer" = 1 ]; then
    log "4/4 head-of-line on llama-server"
    # 12 slots of 5,461 tokens: the 8 streams and the 4 long prompts each get one.
    LD_LIBRARY_PATH="$root/target/peer/build/bin" "$root/target/peer/build/bin/llama-server" \
        -m "$model" --port "$port" -t "$threads" -tb "$threads" -c 65536 -np 12 \
        >"$out/llama-server-hol.log" 2>&1 &
    pid=$!
    wait_ready "$out/llama-server-hol.log"
    lg --scenario hol --json "$out/hol-llama-server.json"
    stop_server llama-server-hol
fi

python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
load = lambda n: json.load(open(os.path.join(out, n))) if os.path.exists(os.path.join(out, n)) else None
cap, soak, over = load("capacity.json"), load("soak.json"), load("overload.json")
hol, peer = load("hol-edgelm.json"), load("hol-llama-server.json")
ms = lambda s: f"{s * 1e3:.0f} ms"
s, o = soak["report"], over["report"]
five = sum(v for k, v in o["errors"].items() if k.startswith("http_5"))
other = {k: v for k, v in o["errors"].items() if k != "http_429"}
summary = {
    # None when RELIABILITY_RATE skipped the capacity step.
    "capacity_req_s": (cap["report"]["ok"] + cap["report"]["disconnected"]) / cap["report"]["duration_s"] if cap else None,
    "soak": {"seconds": s["duration_s"], "sent": s["sent"], "ok": s["ok"], "disconnected_by_design": s["disconnected"],
             "failed": s["failed"], "errors": s["errors"], "ttft": s["ttft"], "itl": s["itl"],
             "server": soak.get("server"), "after": soak.get("after")},
    "overload": {"sent": o["sent"], "ok": o["ok"], "http_429": o["errors"].get("http_429", 0), "http_5xx": five,
                 "other_errors": other, "recovery": over.get("recovery"), "after": over.get("after")},
    "hol": {"edgelm": hol["hol"] if hol else None, "llama_server": peer["hol"] if peer else None},
}
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=2)
if cap:
    print(f"capacity: {summary['capacity_req_s']:.3f} req/s (closed loop, 8 clients)")
g = soak.get("server") or {}
print(f"soak {s['duration_s']:.0f} s at {s['sent'] / s['duration_s']:.3f} req/s: {s['sent']} sent, {s['ok']} ok, "
      f"{s['disconnected']} hung up by design, {s['failed']} failed {s['errors']}; TTFT p50 {ms(s['ttft']['p50'])} "
      f"p99 {ms(s['ttft']['p99'])}; ITL p99 {ms(s['itl']['p99'])}; RSS growth {g.get('rss_growth_pct', float('nan')):+.2f}% "
      f"({g.get('rss_at_warmup_mib', 0):.1f} -> max {g.get('rss_max_mib', 0):.1f} MiB); fds {g.get('fds_at_warmup')} -> "
      f"{g.get('fds_final')}; threads {g.get('threads_at_warmup')} -> {g.get('threads_final')}; after: {soak.get('after')}")
rec = (over.get("recovery") or {}).get("recovered_after_s")
print(f"overload {o['duration_s']:.0f} s at 3x: {o['sent']} sent, {o['ok']} ok, {summary['overload']['http_429']} x 429, {five} x 5xx, "
      f"other {other}; recovered in {rec if rec is None else f'{rec:.1f} s'}; after: {over.get('after')}")
for name, h in (("edgelm", hol), ("llama-server", peer)):
    if h:
        h = h["hol"]
        print(f"head-of-line {name}: ITL p99 {ms(h['itl_before']['p99'])} before, {ms(h['itl_during']['p99'])} during "
              f"= {h['p99_ratio']:.2f}x; burst served in {h['burst_seconds']:.1f} s; errors {h['errors']}")
PY
