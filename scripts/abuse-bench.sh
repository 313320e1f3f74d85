#!/usr/bin/env bash
# Abusive clients, side by side in one run, with autocannon (npm) as the load tool:
#   polite: 16 connections in a closed loop (as many as the running batch holds);
#   flood:  256 connections, each resending the moment it has an answer (429s included);
#   slow:   2,000 connections that each send half a request head and stop, then one normal
#           request timed, the threads and descriptors counted, and how long until the header
#           timeout has closed the half-sent ones.
# Goodput is generated tokens a second (edgelm_generation_tokens_total over the run); TTFT is
# the servers' per-request log lines. The flood's figures leave out its first WARMUP seconds
# (the first burst fills the batch and the queue before any client has been refused).
#
#   scripts/abuse-bench.sh [-d SECONDS (default 60)] [-w WARMUP (default 20)] [-t THREADS (default 2)]
#   EDGELM_BINARY=path/to/edgelm scripts/abuse-bench.sh    (another build, e.g. an older one)
#
# A benchmark, not a test (tests/e2e/test_abusive_clients.py runs the same checks briefly).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
duration=60
warmup=20
threads=2
while getopts "d:w:t:h" opt; do
    case "$opt" in
        d) duration="$OPTARG" ;;
        w) warmup="$OPTARG" ;;
        t) threads="$OPTARG" ;;
        *) echo "usage: $0 [-d SECONDS] [-w WARMUP] [-t THREADS]" >&2; exit 2 ;;
    esac
done
edgelm="${EDGELM_BINARY:-$root/target/release/edgelm}"
autocannon="$root/target/node/node_modules/.bin/autocannon"
[ -x "$autocannon" ] || npm install --prefix target/node --no-audit --no-fund autocannon@9 >/dev/null
[ -x "$edgelm" ] || cargo build --release --quiet
[ -f models/SmolLM2-135M-Instruct.Q4_1.gguf ] || packaging/fetch-model.sh
out="$root/target/abuse-bench"
mkdir -p "$out"
exec python3 - "$edgelm" "$autocannon" "$out" "$duration" "$warmup" "$threads" <<'PY'
import json, re, resource, select, socket, subprocess, sys, threading, time, urllib.request

edgelm, autocannon, out, duration, warmup, threads = sys.argv[1:4] + [int(x) for x in sys.argv[4:7]]
port = 18282
base = f"http://127.0.0.1:{port}"
body = json.dumps({"prompt": "Count from one to a hundred:", "max_tokens": 64, "ignore_eos": True})


def get(path):
    with urllib.request.urlopen(base + path, timeout=10) as r:
        return r.read().decode()


def metrics():
    return {k: float(v) for k, v in re.findall(r"^([a-z_]+) (\S+)$", get("/metrics"), re.M)}


def start(name):
    log = open(f"{out}/{name}.log", "w")
    proc = subprocess.Popen([edgelm, "serve", "-m", "models/SmolLM2-135M-Instruct.Q4_1.gguf", "--port", str(port),
                             "-t", str(threads), "--kv-memory-mib", "768"], stdout=log, stderr=subprocess.STDOUT)
    for _ in range(600):
        try:
            if "ready" in get("/health"):
                return proc, log.name
        except OSError:
            pass
        time.sleep(0.1)
    sys.exit("server not ready")


def stop(proc):
    proc.terminate()
    proc.wait(timeout=60)


def ttfts(text):
    return sorted(float(t) for t in re.findall(r"cmpl-\d+: (?:length|stop), .* ttft=([0-9.]+)s", text))


def pct(xs, q):
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def phase(log_name, connections, seconds, skip):
    log = open(log_name)
    log.seek(0, 2)
    res = {}
    cmd = [autocannon, "-j", "-c", str(connections), "-d", str(seconds), "-t", "60", "-m", "POST",
           "-H", "Content-Type=application/json", "-b", body, base + "/v1/completions"]
    runner = threading.Thread(target=lambda: res.update(json.loads(subprocess.run(cmd, capture_output=True, text=True).stdout)))
    m0, t0 = metrics(), time.time()
    runner.start()
    if skip:
        time.sleep(skip)
        log.read()
        m0, t0 = metrics(), time.time()
    runner.join()
    m1, span = metrics(), time.time() - t0
    time.sleep(3)
    return {"goodput": (m1["edgelm_generation_tokens_total"] - m0["edgelm_generation_tokens_total"]) / span,
            "ttft": ttfts(log.read()), "codes": {k: v["count"] for k, v in res["statusCodeStats"].items()},
            "errors": res["errors"], "timeouts": res["timeouts"], "answers_per_s": res["requests"]["average"],
            "seconds": span, "autocannon_latency_p99_ms": res["latency"]["p99"]}


def slow(n=2000):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, n + 2000)), hard))
    socks, t0 = [], time.time()
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le")
        socks.append(s)
    t1 = time.perf_counter()
    req = urllib.request.Request(base + "/v1/completions", data=json.dumps({"prompt": "Hi", "max_tokens": 1}).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            status = r.status
    except OSError as e:
        status = str(e)
    took = time.perf_counter() - t1
    m = metrics()
    # Which half-sent connections the server closes (EOF or reset) within 30 s.
    poll, left, closed_after = select.poll(), {s.fileno(): s for s in socks}, None
    for fd in left:
        poll.register(fd, select.POLLIN)
    while left and time.time() < t0 + 30:
        for fd, _ in poll.poll(100):
            poll.unregister(fd)
            left.pop(fd)
        closed_after = time.time() - t0
    closed = n - len(left)
    for s in socks:
        s.close()
    return {"status": status, "normal_request_s": took, "threads": m["process_threads"], "fds": m["process_open_fds"],
            "closed": closed, "closed_after_s": closed_after}


proc, log_name = start("abuse")
try:
    phase(log_name, 16, 5, 0)  # warm the caches
    polite = phase(log_name, 16, duration, 0)
    flood = phase(log_name, 256, duration + warmup, warmup)
    slowc = slow()
finally:
    stop(proc)
summary = {"polite": {k: v for k, v in polite.items() if k != "ttft"}, "flood": {k: v for k, v in flood.items() if k != "ttft"},
           "slow": slowc}
for name, p in (("polite", polite), ("flood", flood)):
    summary[name].update(ttft_p50_ms=pct(p["ttft"], 0.5) * 1e3, ttft_p99_ms=pct(p["ttft"], 0.99) * 1e3, answered=len(p["ttft"]))
json.dump(summary, open(f"{out}/summary.json", "w"), indent=2)
P, F = summary["polite"], summary["flood"]
print(f"binary: {edgelm}; {threads} threads; runs of {duration} s (the flood's first {warmup} s left out)")
print(f"{'':8} {'tok/s':>7} {'x':>5} {'TTFT p50':>9} {'TTFT p99':>9} {'answered':>9} {'answers/s':>10}  status codes, errors, timeouts")
for name, s in (("polite", P), ("flood", F)):
    print(f"{name:8} {s['goodput']:7.1f} {s['goodput'] / P['goodput']:5.2f} {s['ttft_p50_ms']:7.0f}ms {s['ttft_p99_ms']:7.0f}ms "
          f"{s['answered']:9d} {s['answers_per_s']:10.0f}  {s['codes']} {s['errors']} {s['timeouts']}")
print(f"slow: 2,000 half-sent heads; a normal request: {slowc['status']} in {slowc['normal_request_s'] * 1e3:.0f} ms; "
      f"{slowc['threads']:.0f} threads, {slowc['fds']:.0f} fds; {slowc['closed']} of 2,000 closed by the server "
      f"within {slowc['closed_after_s'] or 0:.1f} s (of 30 s watched)")
PY
