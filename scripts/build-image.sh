#!/usr/bin/env bash
# OCI image archive, without a container daemon: target/image/edgelm-oci.tar, an OCI image
# layout whose one index holds
#   linux/amd64     the static musl binary (scripts/build-static.sh amd64) on an empty base;
#   linux/arm64/v8  the glibc `cuda` build for Jetson (aarch64-unknown-linux-gnu, --features
#                   cuda) with the glibc it links against (from Debian's arm64 cross sysroot).
#                   It dlopens libcuda and libnvrtc, which the NVIDIA container runtime mounts
#                   from the host (docs/fleet.md says what the host must provide).
# Entrypoint /edgelm, command `serve --host 0.0.0.0 --port 8080 --model /models/model.gguf`:
# the model is never in the image; mount it (hostPath or volume) at /models.
#
# Usage: scripts/build-image.sh
#   EDGELM_AMD64_BIN=PATH  use this already built static amd64 binary (default: build it)
#   EDGELM_ARM64_BIN=PATH  use this already built arm64 glibc cuda binary (default: build it)
#   EDGELM_IMAGE_TAG=TAG   image tag (default: the version `edgelm --version` prints)
#   EDGELM_IMAGE_OUT=PATH  archive path (default target/image/edgelm-oci.tar)
#   EDGELM_BUILD_PROFILE=suite  build with the suite's profile instead of `release` (as
#                               scripts/build-static.sh)
#   CARGO_TARGET_DIR is honoured for the builds; CARGO="flock /work/cargo.lock cargo" serialises.
# Check:  skopeo inspect --raw oci-archive:target/image/edgelm-oci.tar   (both platforms)
# Import: sudo k3s ctr images import target/image/edgelm-oci.tar
set -euo pipefail
cd "$(dirname "$0")/.."

CARGO=${CARGO:-cargo}
tdir=${CARGO_TARGET_DIR:-target}
out=${EDGELM_IMAGE_OUT:-target/image/edgelm-oci.tar}
sysroot=/usr/aarch64-linux-gnu
mkdir -p target/image

amd64=${EDGELM_AMD64_BIN:-}
if [ -z "$amd64" ]; then
    CARGO="$CARGO" scripts/build-static.sh amd64
    amd64=target/static/amd64/edgelm
fi
arm64=${EDGELM_ARM64_BIN:-}
if [ -z "$arm64" ]; then
    profile=${EDGELM_BUILD_PROFILE:-release}
    echo "==> building aarch64-unknown-linux-gnu ($profile, --features cuda)"
    # Debian's cross gcc links (as in scripts/test-aarch64.sh); cudarc needs no CUDA to build.
    # Not stripped by the profile: that would rebuild every dependency the suite's aarch64 build
    # (scripts/test-aarch64.sh, given the same target dir) has built; the image strips below.
    CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
    CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar \
        $CARGO build --profile "$profile" --locked --features cuda --target aarch64-unknown-linux-gnu --bin edgelm
    arm64=$tdir/aarch64-unknown-linux-gnu/$profile/edgelm
fi
for b in "$amd64" "$arm64"; do
    [ -x "$b" ] || { echo "missing binary $b" >&2; exit 1; }
done
file -b "$amd64" | grep -q 'x86-64.*static' || { echo "$amd64 is not a static x86-64 binary" >&2; exit 1; }
file -b "$arm64" | grep -q 'ARM aarch64.*dynamically linked' \
    || { echo "$arm64 is not a dynamic (glibc) aarch64 binary" >&2; exit 1; }

work=$(mktemp -d target/image/work.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/amd64" "$work/arm64/lib/aarch64-linux-gnu"
install -m 0755 "$amd64" "$work/amd64/edgelm"
install -m 0755 "$arm64" "$work/arm64/edgelm"
# Symbols stripped (the static amd64 binary is stripped already; the arm64 one is not).
strip "$work/amd64/edgelm"
aarch64-linux-gnu-strip "$work/arm64/edgelm"

# The arm64 rootfs: the binary, its ELF interpreter and the shared libraries it needs
# (recursively), taken from the cross sysroot: glibc's own directory layout, so no ld.so.cache is
# needed. libcuda/libnvrtc are not among them: they are dlopened and come from the host.
interp=$(aarch64-linux-gnu-readelf -l "$arm64" | sed -n 's/.*Requesting program interpreter: \(.*\)\]/\1/p')
[ -n "$interp" ] || { echo "no ELF interpreter in $arm64" >&2; exit 1; }
mkdir -p "$work/arm64$(dirname "$interp")"
install -m 0755 "$sysroot/lib/$(basename "$interp")" "$work/arm64$interp"
todo=("$arm64")
declare -A seen=()
while [ ${#todo[@]} -gt 0 ]; do
    elf=${todo[0]}
    todo=("${todo[@]:1}")
    for lib in $(aarch64-linux-gnu-readelf -d "$elf" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
        [ -n "${seen[$lib]:-}" ] && continue
        seen[$lib]=1
        [ "$lib" = "$(basename "$interp")" ] && continue
        src=$(readlink -f "$sysroot/lib/$lib")
        [ -f "$src" ] || { echo "$lib (needed by $elf) not in $sysroot/lib" >&2; exit 1; }
        install -m 0755 "$src" "$work/arm64/lib/aarch64-linux-gnu/$lib"
        todo+=("$src")
    done
done
mkdir -p "$work/arm64/tmp" "$work/arm64/var/cache/edgelm" "$work/amd64/tmp"
chmod 1777 "$work/arm64/tmp" "$work/amd64/tmp"
echo "    arm64 rootfs: edgelm, $interp, ${!seen[*]}"

tag=${EDGELM_IMAGE_TAG:-$("$amd64" --version | awk '{print $2}')}
echo "==> writing $out"
# Where the NVIDIA container runtime mounts the driver and CUDA libraries: the dGPU runtime puts
# libcuda in /usr/lib/aarch64-linux-gnu, Jetson's CSV mode in .../tegra and /usr/local/cuda.
p=linux/arm64/v8
python3 scripts/oci-image.py --out "$out" --tag "$tag" \
    --image "linux/amd64=$work/amd64" --image "$p=$work/arm64" \
    --env "$p:LD_LIBRARY_PATH=/usr/lib/aarch64-linux-gnu/tegra:/usr/lib/aarch64-linux-gnu:/usr/local/cuda/lib64" \
    --env "$p:NVIDIA_VISIBLE_DEVICES=all" --env "$p:NVIDIA_DRIVER_CAPABILITIES=compute,utility" \
    --env "$p:EDGELM_CACHE_DIR=/var/cache/edgelm"
