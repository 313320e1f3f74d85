#!/usr/bin/env bash
# Statically linked (musl) release binaries for amd64 and arm64:
#   target/static/amd64/edgelm   (x86_64-unknown-linux-musl)
#   target/static/arm64/edgelm   (aarch64-unknown-linux-musl)
# Usage: scripts/build-static.sh [amd64|arm64]...   (default: both)
#   EDGELM_BUILD_PROFILE=suite  build with the suite's profile (no LTO, parallel codegen units)
#                               instead of `release`; scripts/test.sh does, the packaging
#                               scripts do not.
# Linking uses rust-lld from the toolchain (.cargo/config.toml); no C toolchain is needed.
# Set CARGO="flock /work/cargo.lock cargo" to serialise builds on a shared machine.
set -euo pipefail
cd "$(dirname "$0")/.."

CARGO=${CARGO:-cargo}
arches=("$@")
[ ${#arches[@]} -eq 0 ] && arches=(amd64 arm64)

triple_of() {
    case "$1" in
        amd64) echo x86_64-unknown-linux-musl ;;
        arm64) echo aarch64-unknown-linux-musl ;;
        *) echo "unknown arch '$1' (amd64|arm64)" >&2; return 1 ;;
    esac
}

installed=$(rustup target list --installed 2>/dev/null || true)
for arch in "${arches[@]}"; do
    triple=$(triple_of "$arch")
    if ! grep -qx "$triple" <<<"$installed"; then
        echo "==> rustup target add $triple"
        rustup target add "$triple"
    fi
done

profile=${EDGELM_BUILD_PROFILE:-release}
for arch in "${arches[@]}"; do
    triple=$(triple_of "$arch")
    echo "==> building $triple ($profile, static)"
    # Symbols stripped: the packaged binary has no use for them and shrinks by a lot.
    env "CARGO_PROFILE_${profile^^}_STRIP=symbols" \
        $CARGO build --profile "$profile" --locked --target "$triple" --bin edgelm
    mkdir -p "target/static/$arch"
    cp "target/$triple/$profile/edgelm" "target/static/$arch/edgelm"
    echo "    target/static/$arch/edgelm ($(du -h "target/static/$arch/edgelm" | cut -f1))"
done
