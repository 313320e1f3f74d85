#!/usr/bin/env python3
"""Embedding throughput side by side: edgelm against llama.cpp's `llama-embedding` on the same
GGUF (a model with a pooling type) and thread count, in interleaved rounds (peer, edgelm,
peer, edgelm, ...), medians. Texts per second for batches of TEXTS texts of TOKENS tokens.

    scripts/compare-embeddings.py -m MODEL [-t THREADS] [-r ROUNDS] [--texts 32] [--tokens 128]

The peer is target/peer/build/bin/llama-embedding (scripts/build-peer.sh builds it). It gets
the texts as one run, in batches of --peer-batch texts (-c/-b/-ub = that many texts' tokens;
default: all in one batch; its attention then spans the whole batch, masked, so smaller
batches are faster for it), and its time is the run's wall time less that of a run on one
word (loading the model). edgelm's
is `edgelm bench --embeddings` (the batch submitted at once, timed to its last vector). A
benchmark, not a test: it prints the figures and writes them to target/compare-embeddings.json.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PEER = ROOT / "target/peer/build/bin/llama-embedding"
EDGELM = Path(os.environ.get("EDGELM_BINARY", ROOT / "target/release/edgelm"))


def text_of(model: Path, tokens: int) -> str:
    """A text of exactly `tokens` tokens for the model (its content does not change the cost)."""
    words = tokens
    while words > 0:
        text = " ".join(["word"] * words)
        ids = json.loads(subprocess.run([str(EDGELM), "tokenize", "-m", str(model), "--add-bos", text],
                                        check=True, capture_output=True, text=True).stdout)
        if len(ids) <= tokens:
            return text
        words -= len(ids) - tokens
    sys.exit("cannot make a text of that many tokens")


def peer_seconds(model: Path, threads: int, prompt: str, ctx: int) -> float:
    env = {**os.environ, "LD_LIBRARY_PATH": str(PEER.parent)}
    args = [str(PEER), "-m", str(model), "-t", str(threads), "-c", str(ctx), "-b", str(ctx), "-ub", str(ctx),
            "-p", prompt, "--embd-output-format", "array"]
    start = time.perf_counter()
    subprocess.run(args, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def ours_texts_per_s(model: Path, threads: int, texts: int, tokens: int) -> float:
    out = subprocess.run([str(EDGELM), "bench", "--embeddings", "--json", "-m", str(model), "-t", str(threads),
                          "-r", "1", "--embed-texts", str(texts), "--embed-tokens", str(tokens),
                          "--max-batched-tokens", str(max(512, tokens))],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)["texts_per_s"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", type=Path, required=True)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--rounds", type=int, default=3)
    ap.add_argument("--texts", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--peer-batch", type=int, default=0,
                    help="texts per llama-embedding batch (default: all of them in one)")
    a = ap.parse_args()
    for exe in (PEER, EDGELM):
        if not exe.exists():
            sys.exit(f"{exe} missing (scripts/build-peer.sh builds the peer; cargo build --release edgelm)")
    text = text_of(a.model, a.tokens)
    batch = "\n".join([text] * a.texts)
    ctx = (a.peer_batch or a.texts) * a.tokens
    peer, ours = [], []
    for r in range(a.rounds):
        full = peer_seconds(a.model, a.threads, batch, ctx)
        load = peer_seconds(a.model, a.threads, "word", 512)
        peer.append(a.texts / max(full - load, 1e-6))
        ours.append(ours_texts_per_s(a.model, a.threads, a.texts, a.tokens))
        print(f"round {r + 1}: llama-embedding {peer[-1]:.1f} texts/s, edgelm {ours[-1]:.1f} texts/s", file=sys.stderr)
    figures = {"model": a.model.name, "threads": a.threads, "texts": a.texts, "tokens_per_text": a.tokens,
               "peer_batch_texts": a.peer_batch or a.texts, "rounds": a.rounds, "llama_embedding_texts_per_s": statistics.median(peer),
               "edgelm_texts_per_s": statistics.median(ours)}
    figures["ratio"] = figures["edgelm_texts_per_s"] / figures["llama_embedding_texts_per_s"]
    print(f"embeddings, {a.texts} texts x {a.tokens} tokens, {a.threads} threads, medians of {a.rounds}: "
          f"edgelm {figures['edgelm_texts_per_s']:.1f} texts/s, llama-embedding "
          f"{figures['llama_embedding_texts_per_s']:.1f} texts/s ({figures['ratio']:.2f}x)")
    out = ROOT / "target/compare-embeddings.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
