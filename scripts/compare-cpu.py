#!/usr/bin/env python3
"""Side-by-side prefill and decode of edgelm's CPU kernels against one peer build.

    scripts/compare-cpu.py --peer PEER [--level SIMD] [-m MODEL]... [-t 2] [-r 3] [-p 512] [-n 128]

PEER is a scripts/build-peer.sh flavour, built on first use: `native` (llama.cpp for this
CPU), `ik` (ik_llama.cpp, run with -rtr 1 -fa 1), `avx2-vnni` or `avx2` (llama.cpp built for
that instruction set, AVX-512 off). SIMD forces edgelm's kernel level (EDGELM_SIMD: avx2-vnni,
avx2, ...; default: the best this CPU has). Each round runs the peer's llama-bench, then
edgelm's bench, on every model (peer, edgelm, peer, edgelm...), so both see the same states of
a machine whose speed drifts; each figure is the median over the rounds. Before each run it
waits (up to COMPARE_IDLE_WAIT_S seconds, default 300) for the machine to be idle. Prints
pp/tg tokens per second and the ratios, and writes them to target/compare-cpu-PEER.json.
A benchmark, not a test: it exits 0 whatever the ratios are.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ["models/SmolLM2-135M-Instruct.Q4_1.gguf", "models/gemma-3-270m-Q4_K_M.gguf"]


def log(msg):
    print(f"compare-cpu: {msg}", file=sys.stderr, flush=True)


def busy_s():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v[:8]) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def wait_idle():
    """Waits for a 2-second window in which the CPUs were under 10% busy."""
    limit = float(os.environ.get("COMPARE_IDLE_WAIT_S", "300"))
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        b0 = busy_s()
        time.sleep(2)
        if (busy_s() - b0) / (2 * os.cpu_count()) < 0.10:
            return
    if limit > 0:
        log(f"the machine stayed busy for {limit:.0f} s; running anyway")


def run_json(cmd, env=None):
    wait_idle()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        sys.exit(f"compare-cpu: {' '.join(map(str, cmd))} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout)


def peer_round(bench, model, args, ik):
    cmd = [bench, "-m", model, "-t", str(args.threads), "-p", str(args.prompt),
           "-n", str(args.gen), "-r", "1", "-o", "json"]
    if ik:
        cmd += ["-rtr", "1", "-fa", "1"]
    rows = run_json(cmd)
    pp = next(r["avg_ts"] for r in rows if r["n_gen"] == 0)
    tg = next(r["avg_ts"] for r in rows if r["n_prompt"] == 0)
    return pp, tg


def edgelm_round(model, args):
    env = dict(os.environ)
    if args.level:
        env["EDGELM_SIMD"] = args.level
    r = run_json([ROOT / "target/release/edgelm", "bench", "-m", model, "-t", str(args.threads),
                  "-p", str(args.prompt), "-n", str(args.gen), "--concurrency", "1",
                  "--shared-prefix", "0", "-r", "1", "--json"], env)
    return r["prefill_tok_s"], r["decode_tok_s"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer", required=True, choices=["native", "ik", "avx2-vnni", "avx2"])
    ap.add_argument("--level", help="EDGELM_SIMD for edgelm (default: this CPU's best)")
    ap.add_argument("-m", "--model", action="append", help="GGUF (repeatable; default: both real models)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--rounds", type=int, default=3)
    ap.add_argument("-p", "--prompt", type=int, default=512)
    ap.add_argument("-n", "--gen", type=int, default=128)
    args = ap.parse_args()
    os.chdir(ROOT)
    models = args.model or MODELS
    for m in models:
        if not Path(m).exists():
            sys.exit(f"compare-cpu: model not found: {m} (packaging/fetch-model.sh [gemma3] fetches the real ones)")

    env = dict(os.environ, PEER_FLAVOUR=args.peer)
    subprocess.run(["scripts/build-peer.sh", "llama-bench"], check=True, env=env)
    subprocess.run(["cargo", "build", "--release", "--quiet"], check=True)
    peer_dir = "target/peer" if args.peer == "native" else f"target/peer-{args.peer}"
    bench = f"{peer_dir}/build/bin/llama-bench"

    figures = {m: {"peer": [], "edgelm": []} for m in models}
    for i in range(args.rounds):
        for m in models:
            log(f"round {i + 1}/{args.rounds}: {Path(m).name}")
            figures[m]["peer"].append(peer_round(bench, m, args, args.peer == "ik"))
            figures[m]["edgelm"].append(edgelm_round(m, args))

    level = args.level or "best"
    print(f"edgelm ({level}) against {args.peer}, {args.threads} threads, "
          f"medians of {args.rounds} interleaved rounds, tokens/s")
    print(f"{'model':40} {'peer pp':>9} {'edgelm pp':>10} {'ratio':>6} {'peer tg':>9} {'edgelm tg':>10} {'ratio':>6}")
    report = []
    for m, f in figures.items():
        med = {k: [statistics.median(x[j] for x in v) for j in (0, 1)] for k, v in f.items()}
        row = {"model": Path(m).name, "peer_pp": med["peer"][0], "edgelm_pp": med["edgelm"][0],
               "peer_tg": med["peer"][1], "edgelm_tg": med["edgelm"][1],
               "pp_ratio": med["edgelm"][0] / med["peer"][0],
               "tg_ratio": med["edgelm"][1] / med["peer"][1], "rounds": f}
        report.append(row)
        print(f"{row['model']:40} {row['peer_pp']:9.1f} {row['edgelm_pp']:10.1f} {row['pp_ratio']:5.2f}x "
              f"{row['peer_tg']:9.1f} {row['edgelm_tg']:10.1f} {row['tg_ratio']:5.2f}x")
    out = ROOT / f"target/compare-cpu-{args.peer}.json"
    out.write_text(json.dumps({"peer": args.peer, "level": level, "threads": args.threads,
                               "rounds": args.rounds, "models": report}, indent=2))
    log(f"wrote {out}")


if __name__ == "__main__":
    main()
