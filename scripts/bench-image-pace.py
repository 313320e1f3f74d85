#!/usr/bin/env python3
"""Whether streams keep their pace while images come in: against a running `edgelm serve` with a
projector (BASE, e.g. http://127.0.0.1:8080), a greedy 128-token completion stream alone, then
again while another client sends a chat request with an image every second (each image a new
crop of IMAGE, so every one is encoded and prefilled). Prints, per round, each run's median and
p99 gap between streamed tokens, their ratio and whether the text was the same.

Run with the test venv's python (httpx, Pillow): target/test-venv/bin/python
scripts/bench-image-pace.py BASE IMAGE [--rounds N]"""

import argparse
import base64
import io
import json
import statistics
import threading
import time

import httpx
from PIL import Image


def stream(base: str) -> tuple[list[float], str]:
    gaps, text, last = [], [], None
    with httpx.stream("POST", base + "/v1/completions", timeout=300, json={
            "prompt": "Write a long story about a lighthouse keeper.", "max_tokens": 128,
            "temperature": 0, "stream": True, "ignore_eos": True}) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            now = time.perf_counter()
            if last is not None:
                gaps.append(now - last)
            last = now
            text.append(json.loads(line[6:])["choices"][0]["text"])
    return gaps, "".join(text)


def p99(gaps: list[float]) -> float:
    g = sorted(gaps)
    return g[min(len(g) - 1, round(0.99 * (len(g) - 1)))]


class Images:
    """A client sending one image request a second, each a new crop, until stopped."""

    def __init__(self, base: str, image: str):
        self.base, self.src, self.sent = base, Image.open(image).convert("RGB"), 0
        self.stop = threading.Event()

    def url(self) -> str:
        i, out = self.sent, io.BytesIO()
        w, h = self.src.size
        self.src.crop((i % 40, i // 40 % 40, w - 40 + i % 40, h - 40 + i // 40 % 40)).save(out, "PNG")
        return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()

    def run(self):
        while not self.stop.is_set():
            t = time.perf_counter()
            r = httpx.post(self.base + "/v1/chat/completions", timeout=300, json={
                "max_tokens": 1, "messages": [{"role": "user", "content": [
                    {"type": "image_url", "image_url": {"url": self.url()}},
                    {"type": "text", "text": "What is in this picture?"}]}]})
            r.raise_for_status()
            self.sent += 1
            self.stop.wait(max(0.0, 1.0 - (time.perf_counter() - t)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("base")
    ap.add_argument("image")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    images = Images(args.base, args.image)
    for rnd in range(args.rounds):
        alone, text_alone = stream(args.base)
        images.stop.clear()
        sender = threading.Thread(target=images.run)
        sender.start()
        busy, text_busy = stream(args.base)
        images.stop.set()
        sender.join()
        print(f"round {rnd + 1}: alone median {statistics.median(alone) * 1e3:.1f} ms, p99 "
              f"{p99(alone) * 1e3:.1f} ms; with an image a second median "
              f"{statistics.median(busy) * 1e3:.1f} ms, p99 {p99(busy) * 1e3:.1f} ms "
              f"({p99(busy) / p99(alone):.2f}×); same text: {text_alone == text_busy}; "
              f"images sent so far {images.sent}", flush=True)


if __name__ == "__main__":
    main()
