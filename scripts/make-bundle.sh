#!/usr/bin/env bash
# Offline install bundle: target/bundle/edgelm-<version>-<arch>.tar.gz holding the static
# binary, a model, a profile, the systemd files, SHA256SUMS and install.sh.
# Usage: scripts/make-bundle.sh [ARCH] [MODEL] [PROFILE]
#   ARCH     amd64 (default) | arm64
#   MODEL    GGUF file (default models/SmolLM2-135M-Instruct.Q4_1.gguf)
#   PROFILE  profile TOML (default firmware-configs/x86-cpu.toml)
# EDGELM_SYSTEMD_DIR overrides where edgelm.{service,sysusers,tmpfiles,default} are (systemd/).
set -euo pipefail
cd "$(dirname "$0")/.."

arch=${1:-amd64}
model=${2:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
profile=${3:-firmware-configs/x86-cpu.toml}
sysdir=${EDGELM_SYSTEMD_DIR:-systemd}
case "$arch" in amd64|arm64) ;; *) echo "unknown arch '$arch' (amd64|arm64)" >&2; exit 2 ;; esac
[ -f "$model" ] || { echo "missing model $model (packaging/fetch-model.sh)" >&2; exit 1; }
[ -f "$profile" ] || { echo "missing profile $profile" >&2; exit 1; }
for f in edgelm.service edgelm.sysusers edgelm.tmpfiles edgelm.default; do
    [ -f "$sysdir/$f" ] || { echo "missing $sysdir/$f (set EDGELM_SYSTEMD_DIR)" >&2; exit 1; }
done
[ -x "target/static/$arch/edgelm" ] || scripts/build-static.sh "$arch"

version=$(sed -n 's/^version *= *"\(.*\)"/\1/p' Cargo.toml | head -1)
name=edgelm-$version-$arch
stage=target/bundle/stage/$name
rm -rf "target/bundle/stage"
mkdir -p "$stage/bin" "$stage/models" "$stage/systemd"
install -m 0755 "target/static/$arch/edgelm" "$stage/bin/edgelm"
cp -L "$model" "$stage/models/$(basename "$model")"
chmod 0644 "$stage/models/$(basename "$model")"
install -m 0644 "$profile" "$stage/profile.toml"
for f in edgelm.service edgelm.sysusers edgelm.tmpfiles edgelm.default; do
    install -m 0644 "$sysdir/$f" "$stage/systemd/$f"
done
install -m 0755 packaging/bundle/install.sh "$stage/install.sh"
(cd "$stage" && find . -type f ! -name SHA256SUMS | sed 's|^\./||' | sort | xargs sha256sum > SHA256SUMS)

out=target/bundle/$name.tar.gz
tar -C target/bundle/stage --owner=0 --group=0 --numeric-owner --sort=name -czf "$out" "$name"
rm -rf target/bundle/stage
echo "$out"
