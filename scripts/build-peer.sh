#!/usr/bin/env bash
# Builds the peer, llama.cpp, from the llama.cpp vendored in the PyPI sdist of llama-cpp-python
# (pinned and SHA-256-checked below) into target/peer/build/bin, once: later calls find the
# binaries and return at once. Used by scripts/test.sh (the KL-divergence and tokenizer tests),
# scripts/compare-peer.sh and scripts/reliability.sh.
#
#   [PEER_FLAVOUR=F] scripts/build-peer.sh [TARGET...]
#       (default: llama-bench llama-batched-bench llama-server llama-perplexity llama-tokenize
#       llama-embedding); `mtmd-embed` and `mtmd-logits` are scripts/peer/NAME.cpp, small
#       harnesses on libmtmd's and libllama's APIs (the vision tests' peer): mtmd-embed dumps
#       the projector's image embeddings, mtmd-logits the text model's logits for a prompt
#       holding an image, teacher-forced over a continuation
#
# PEER_FLAVOUR picks a build for the CPU-kernel comparisons (scripts/compare-cpu.sh), each in
# target/peer-F/build/bin:
#   native     (default, target/peer) llama.cpp for this CPU (-march=native, AMX off);
#   avx2-vnni  llama.cpp for AVX2 + AVX-VNNI, AVX-512 off (Intel N100/N305, Core Ultra);
#   avx2       llama.cpp for AVX2 alone;
#   ik         ik_llama.cpp, the CPU-speed fork, from its PyPI sdist ik-llama-cpp-python
#              (-march=native, AMX off; run it with -rtr 1 -fa 1);
#   aarch64-CPU  llama.cpp cross-built for aarch64 with -mcpu=CPU (neoverse-n1, neoverse-v1,
#              cortex-a72: qemu's CPU models), statically linked, to run under qemu-aarch64.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(llama-bench llama-batched-bench llama-server llama-perplexity llama-tokenize
    llama-embedding)

flavour="${PEER_FLAVOUR:-native}"
peer_pkg="llama-cpp-python"
peer_version="0.3.36"
peer_sha256="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
vendored="llama.cpp"
if [ "$flavour" = ik ]; then
    peer_pkg="ik-llama-cpp-python"
    peer_version="0.1.5"
    peer_sha256="33c67eb99e4dcab5e611050433243815709b8b3067753f9ce18375013cf002ad"
    vendored="ik_llama.cpp"
fi
peer_dist="${peer_pkg//-/_}-$peer_version"
peer_dir="$root/target/peer"
[ "$flavour" = native ] || peer_dir="$root/target/peer-$flavour"
peer_src="$peer_dir/src/$peer_dist"
peer_build="$peer_dir/build"

# Some VMs report AMX in cpuid but fault on it (SIGILL in ggml's AMX matmul), so AMX is kept
# out of -march=native (GCC lets explicit -mno-* flags win over -march). The flags are x86's:
# on an aarch64 host (a Jetson, a Raspberry Pi, a Graviton) GCC would reject them, and ggml's
# native build there is -mcpu=native.
no_amx=""
case "$(uname -m)" in x86_64|i?86) no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" ;; esac
case "$flavour" in
    native|ik) isa=(-DGGML_NATIVE=ON -DCMAKE_C_FLAGS="$no_amx" -DCMAKE_CXX_FLAGS="$no_amx") ;;
    avx2-vnni) isa=(-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX_VNNI=ON
        -DGGML_AVX512=OFF) ;;
    avx2) isa=(-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF) ;;
    aarch64-*)
        cpu="${flavour#aarch64-}"
        isa=(-DCMAKE_SYSTEM_NAME=Linux -DCMAKE_SYSTEM_PROCESSOR=aarch64
            -DCMAKE_C_COMPILER=aarch64-linux-gnu-gcc -DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++
            -DGGML_NATIVE=OFF -DGGML_OPENMP=OFF -DBUILD_SHARED_LIBS=OFF
            -DCMAKE_C_FLAGS="-mcpu=$cpu" -DCMAKE_CXX_FLAGS="-mcpu=$cpu"
            -DCMAKE_EXE_LINKER_FLAGS="-static")
        ;;
    *) echo "build-peer: error: unknown PEER_FLAVOUR $flavour" >&2; exit 2 ;;
esac

log() { echo "build-peer: $*" >&2; }
die() { echo "build-peer: error: $*" >&2; exit 1; }

# --- the peer: llama.cpp from the llama-cpp-python sdist ------------------------------------
build_peer() {
    local tools=()
    command -v cmake >/dev/null || tools+=(cmake)
    command -v c++ >/dev/null || tools+=(g++)
    command -v make >/dev/null || tools+=(make)
    if [ ${#tools[@]} -gt 0 ]; then
        log "installing ${tools[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${tools[@]}" >/dev/null
    fi
    case "$flavour" in
        aarch64-*)
            # shellcheck source=scripts/aarch64-toolchain.sh
            . "$root/scripts/aarch64-toolchain.sh"
            aarch64_install c++
            ;;
    esac

    mkdir -p "$peer_dir/dl" "$peer_dir/src"
    local tarball="$peer_dir/dl/$peer_dist.tar.gz"
    if [ ! -f "$tarball" ] || [ "$(sha256sum "$tarball" | cut -d' ' -f1)" != "$peer_sha256" ]; then
        rm -f "$tarball"
        log "downloading the $peer_pkg==$peer_version sdist"
        # --no-binary for this package only: ':all:' would also build pip's build-backend
        # dependencies (cmake among them) from source, which takes the better part of an hour.
        python3 -m pip download --quiet --disable-pip-version-check --no-deps \
            --no-binary "$peer_pkg" "$peer_pkg==$peer_version" -d "$peer_dir/dl" >&2 \
            || die "pip could not download the $peer_pkg==$peer_version sdist"
        [ -f "$tarball" ] || die "pip did not leave $(basename "$tarball") in $peer_dir/dl"
        local got
        got="$(sha256sum "$tarball" | cut -d' ' -f1)"
        [ "$got" = "$peer_sha256" ] || die "$tarball has SHA-256 $got, expected $peer_sha256"
    fi
    if [ ! -f "$peer_src/vendor/$vendored/CMakeLists.txt" ]; then
        log "unpacking $(basename "$tarball")"
        rm -rf "$peer_src"
        tar -xzf "$tarball" -C "$peer_dir/src"
        [ -f "$peer_src/vendor/$vendored/CMakeLists.txt" ] || die "no vendor/$vendored in the sdist"
    fi

    if [ "$flavour" = ik ] && [ ! -f "$peer_src/vendor/$vendored/common/build-info.cpp" ]; then
        # The sdist leaves out the file its CMake would generate from git metadata.
        sed -e 's/@BUILD_NUMBER@/0/' -e 's/@BUILD_COMMIT@/sdist-'"$peer_version"'/' \
            -e 's/@BUILD_COMPILER@/gcc/' -e 's/@BUILD_TARGET@/x86_64/' \
            "$peer_src/vendor/$vendored/common/build-info.cpp.in" \
            >"$peer_src/vendor/$vendored/common/build-info.cpp"
    fi

    log "building ${targets[*]} ($flavour) into $peer_build (log: $peer_dir/build.log; ~10 min on 2 cores)"
    local t0=$SECONDS
    # The harnesses are ours: CMake builds the libraries they link (mtmd, llama), then c++ each
    # harness.
    local cmake_targets=() harnesses=() src="$peer_src/vendor/$vendored"
    for t in "${targets[@]}"; do
        case "$t" in
            mtmd-embed|mtmd-logits) cmake_targets+=(mtmd llama) harnesses+=("$t") ;;
            *) cmake_targets+=("$t") ;;
        esac
    done
    # Tests, OpenSSL and curl are off, and so is the server's web UI (its prebuilt assets
    # would be fetched from the network at configure time); llama-server still builds.
    if ! {
        cmake -S "$peer_src/vendor/$vendored" -B "$peer_build" \
            -DCMAKE_BUILD_TYPE=Release -DGGML_CCACHE=OFF "${isa[@]}" \
            -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
            -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TOOLS=ON \
            -DLLAMA_BUILD_SERVER=ON -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF &&
        cmake --build "$peer_build" --config Release -j "${PEER_BUILD_JOBS:-2}" \
            --target "${cmake_targets[@]}" &&
        (
            for h in ${harnesses[@]+"${harnesses[@]}"}; do
                c++ -O2 -std=c++17 -I"$src/include" -I"$src/ggml/include" -I"$src/tools/mtmd" \
                    "$root/scripts/peer/$h.cpp" -o "$peer_build/bin/$h" -L"$peer_build/bin" \
                    -Wl,-rpath,"$peer_build/bin" -lmtmd -lllama -lggml -lggml-base || exit 1
            done
        )
    } >>"$peer_dir/build.log" 2>&1; then
        tail -n 30 "$peer_dir/build.log" >&2
        die "the llama.cpp build failed (full log: $peer_dir/build.log)"
    fi
    log "peer built in $((SECONDS - t0)) s"
}

missing=()
for t in "${targets[@]}"; do
    [ -x "$peer_build/bin/$t" ] || missing+=("$t")
done
if [ ${#missing[@]} -gt 0 ]; then
    targets=("${missing[@]}")
    build_peer
fi
for t in "${targets[@]}"; do
    [ -x "$peer_build/bin/$t" ] || die "$t missing after the build"
done

