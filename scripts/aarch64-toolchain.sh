# Sourced, not run: the aarch64 cross toolchain and qemu-user on an x86 host, installed once,
# for the scripts that cross-build for aarch64 or run aarch64 binaries under emulation
# (scripts/test-aarch64.sh, scripts/arm-insns.sh, scripts/arm-check.sh --rehearse,
# scripts/build-peer.sh's aarch64-CPU flavours).
#
#   . scripts/aarch64-toolchain.sh
#   aarch64_install [c++]   apt-installs the cross gcc (g++ too with c++), the aarch64 glibc
#                           and qemu-user, each only when absent
#   aarch64_rust            adds the rustup target and exports the cross linker for cargo
#   aarch64_probe DIR       builds DIR/cpu-features, which prints the CPU features std's runtime
#                           detection sees (run it under qemu-aarch64 -cpu MODEL -L $aarch64_sysroot)

aarch64_triple="aarch64-unknown-linux-gnu"
aarch64_sysroot="/usr/aarch64-linux-gnu"

aarch64_install() {
    local pkgs=()
    command -v aarch64-linux-gnu-gcc >/dev/null || pkgs+=(gcc-aarch64-linux-gnu)
    if [ ! -f "$aarch64_sysroot/include/stdio.h" ] || [ ! -e "$aarch64_sysroot/lib/ld-linux-aarch64.so.1" ]; then
        pkgs+=(libc6-dev-arm64-cross)
    fi
    command -v qemu-aarch64 >/dev/null || pkgs+=(qemu-user)
    if [ "${1:-}" = "c++" ]; then
        command -v aarch64-linux-gnu-g++ >/dev/null || pkgs+=(g++-aarch64-linux-gnu)
    fi
    [ ${#pkgs[@]} -gt 0 ] || return 0
    echo "aarch64-toolchain: apt-get install ${pkgs[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
}

aarch64_rust() {
    if ! rustup target list --installed | grep -qx "$aarch64_triple"; then
        echo "aarch64-toolchain: rustup target add $aarch64_triple" >&2
        rustup --quiet target add "$aarch64_triple"
    fi
    # The linker is in .cargo/config.toml too; repeated so that a CARGO_HOME or config
    # elsewhere cannot drop it. CC/AR name the cross compiler for any build script that
    # compiles C (none in Cargo.lock does).
    export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
    export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
    export AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar
}

aarch64_probe() {
    local dir="$1"
    mkdir -p "$dir"
    [ -x "$dir/cpu-features" ] && return 0
    # The same runtime detection the crate uses (std's is_aarch64_feature_detected!).
    cat >"$dir/cpu-features.rs" <<'RS'
fn main() {
    macro_rules! report { ($($f:tt),*) => {{
        let (mut have, mut lack) = (Vec::new(), Vec::new());
        $( if std::arch::is_aarch64_feature_detected!($f) { have.push($f) } else { lack.push($f) } )*
        println!("  present: {}", have.join(" "));
        println!("  absent:  {}", if lack.is_empty() { "-".to_string() } else { lack.join(" ") });
    }} }
    report!("neon", "dotprod", "i8mm", "fp16", "fhm", "rdm", "bf16", "sve", "sve2", "lse",
            "crc", "aes", "sha2", "sha3", "rcpc");
}
RS
    rustc --edition 2021 -O --target "$aarch64_triple" -C linker=aarch64-linux-gnu-gcc \
        -o "$dir/cpu-features" "$dir/cpu-features.rs"
}
