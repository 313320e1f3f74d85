#!/usr/bin/env python3
"""Tokenizes each string of a JSON list with the peer's llama-tokenize (BOS as the model wants,
special tokens parsed, no escape processing) and prints {"cases": [{"text", "ids"}]} as JSON.

    scripts/peer-tokenize.py MODEL.gguf CASES.json > OUT.json

The peer comes from scripts/build-peer.sh; the output is the reference tests/data keeps.
"""
import json
import os
import subprocess
import sys
import tempfile

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
tokenize = os.path.join(root, "target/peer/build/bin/llama-tokenize")
model, cases_path = sys.argv[1:3]
out = []
for text in json.load(open(cases_path, encoding="utf-8")):
    with tempfile.NamedTemporaryFile("wb", delete=False) as f:
        f.write(text.encode("utf-8"))
    try:
        res = subprocess.run(
            [tokenize, "-m", model, "-f", f.name, "--ids", "--no-escape", "--log-disable"],
            capture_output=True, check=True, text=True)
    finally:
        os.unlink(f.name)
    line = [l for l in res.stdout.splitlines() if l.startswith("[")][-1]
    out.append({"text": text, "ids": json.loads(line)})
# One case per line: small diffs when a case is added.
print('{"model": %s, "cases": [' % json.dumps(os.path.basename(model)))
print(",\n".join(json.dumps(c, ensure_ascii=False) for c in out))
print("]}")
