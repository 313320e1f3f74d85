#!/usr/bin/env bash
# Debian package of the static binary: target/deb/edgelm_<version>-<rev>_<arch>.deb
# Usage: scripts/package-deb.sh amd64|arm64
# Needs target/static/<arch>/edgelm (scripts/build-static.sh builds it when missing).
# Environment:
#   EDGELM_SYSTEMD_DIR   where edgelm.{service,sysusers,tmpfiles,default} are (default systemd/)
#   EDGELM_PROFILE       profile installed as /etc/edgelm/profile.toml (default: per arch)
#   EDGELM_MODEL_NAME    model file name model.path points to under /var/lib/edgelm/models/
#   DEB_REVISION         Debian revision (default 1); DEB_MAINTAINER  Maintainer field
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

arch=${1:?usage: $0 amd64|arm64}
case "$arch" in amd64|arm64) ;; *) echo "unknown arch '$arch' (amd64|arm64)" >&2; exit 2 ;; esac

version=$(sed -n 's/^version *= *"\(.*\)"/\1/p' Cargo.toml | head -1)
revision=${DEB_REVISION:-1}
maintainer=${DEB_MAINTAINER:-"edgelm maintainers <edgelm-maintainers@example.com>"}
sysdir=${EDGELM_SYSTEMD_DIR:-systemd}
model_name=${EDGELM_MODEL_NAME:-SmolLM2-135M-Instruct.Q4_1.gguf}
binary=target/static/$arch/edgelm

# Default profile: the generic CPU box on amd64; on arm64 the smallest Jetson (Orin Nano
# 8 GB), whose budgets are safe on any Orin. All profiles are installed under
# /etc/edgelm/profiles/ to pick another.
if [ -z "${EDGELM_PROFILE:-}" ]; then
    EDGELM_PROFILE=firmware-configs/x86-cpu.toml
    [ "$arch" = arm64 ] && EDGELM_PROFILE=firmware-configs/orin-nano-8gb.toml
fi

for f in edgelm.service edgelm.sysusers edgelm.tmpfiles edgelm.default; do
    [ -f "$sysdir/$f" ] || { echo "missing $sysdir/$f (set EDGELM_SYSTEMD_DIR)" >&2; exit 1; }
done
[ -f "$EDGELM_PROFILE" ] || { echo "missing profile $EDGELM_PROFILE" >&2; exit 1; }
[ -x "$binary" ] || scripts/build-static.sh "$arch"

stage=target/deb/stage-$arch
rm -rf "$stage"
mkdir -p "$stage/DEBIAN"
umask 022

inst() { # inst MODE SRC DEST
    install -D -m "$1" "$2" "$stage/$3"
}
inst 0755 "$binary" usr/bin/edgelm
inst 0644 "$sysdir/edgelm.service" lib/systemd/system/edgelm.service
inst 0644 "$sysdir/edgelm.sysusers" usr/lib/sysusers.d/edgelm.conf
inst 0644 "$sysdir/edgelm.tmpfiles" usr/lib/tmpfiles.d/edgelm.conf
inst 0644 "$sysdir/edgelm.default" etc/default/edgelm
for p in firmware-configs/*.toml; do
    inst 0644 "$p" "etc/edgelm/profiles/$(basename "$p")"
done
# The active profile: model.path points at the state directory's models/.
mkdir -p "$stage/etc/edgelm"
awk -v model="/var/lib/edgelm/models/$model_name" '
    /^[[:space:]]*\[/ { in_model = ($0 ~ /^[[:space:]]*\[model\]/) }
    in_model && !done && /^[[:space:]]*path[[:space:]]*=/ { print "path = \"" model "\""; done = 1; next }
    { print }' "$EDGELM_PROFILE" > "$stage/etc/edgelm/profile.toml"
chmod 0644 "$stage/etc/edgelm/profile.toml"

doc=$stage/usr/share/doc/edgelm
inst 0644 packaging/deb/copyright usr/share/doc/edgelm/copyright
date_r=$(date -u -R -d "@${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}")
cat > "$doc/changelog.Debian" <<CHANGELOG
edgelm ($version-$revision) unstable; urgency=medium

  * Package the statically linked edgelm $version binary.

 -- $maintainer  $date_r
CHANGELOG
gzip -9n "$doc/changelog.Debian"
inst 0644 packaging/deb/edgelm.1 usr/share/man/man1/edgelm.1
gzip -9n "$stage/usr/share/man/man1/edgelm.1"
inst 0644 packaging/deb/lintian-overrides usr/share/lintian/overrides/edgelm

for s in postinst prerm postrm; do
    install -m 0755 "packaging/deb/$s" "$stage/DEBIAN/$s"
done
(cd "$stage" && find etc -type f | sort | sed 's|^|/|') > "$stage/DEBIAN/conffiles"
chmod 0644 "$stage/DEBIAN/conffiles"
(cd "$stage" && find . -path ./DEBIAN -prune -o -path ./etc -prune -o -type f -print \
    | sed 's|^\./||' | sort | xargs md5sum) > "$stage/DEBIAN/md5sums"
chmod 0644 "$stage/DEBIAN/md5sums"

installed_kib=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
cat > "$stage/DEBIAN/control" <<CONTROL
Package: edgelm
Version: $version-$revision
Architecture: $arch
Maintainer: $maintainer
Installed-Size: $installed_kib
Section: net
Priority: optional
Description: single-binary LLM inference server for edge boxes
 edgelm serves GGUF language models through an OpenAI-compatible HTTP API
 (completions and chat completions) on the CPU, with a paged KV cache and
 continuous batching. The binary is statically linked and has no runtime
 dependencies; the systemd unit serves /etc/edgelm/profile.toml, which
 expects the model under /var/lib/edgelm/models/.
CONTROL

mkdir -p target/deb
out=target/deb/edgelm_${version}-${revision}_${arch}.deb
dpkg-deb --root-owner-group -Zxz --build "$stage" "$out" >/dev/null
echo "$out"
