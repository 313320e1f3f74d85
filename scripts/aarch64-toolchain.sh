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
#   aarch64_qemu_for MODEL DIR
#                           prints a qemu-aarch64 that emulates CPU MODEL: the installed one, or
#                           else Debian 13's (qemu 10, static binaries), fetched once into DIR

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

# Debian 12's qemu-user is 7.2, which lacks CPU models that came later (neoverse-v1, the i8mm
# model, came in 8.1). Debian 13's qemu-user package holds static binaries of qemu 10 that run
# here; apt fetches it with a sources list and state of its own under DIR, so the system's apt
# setup is never touched.
aarch64_qemu_for() {
    local model="$1" dir="$2" apt_opts
    # `-cpu help` exits 1 after listing the models.
    if (qemu-aarch64 -cpu help || true) | grep -qw -- "$model"; then
        command -v qemu-aarch64
        return 0
    fi
    if [ ! -x "$dir/usr/bin/qemu-aarch64" ]; then
        echo "aarch64-toolchain: qemu-user from Debian 13 into $dir (this qemu lacks -cpu $model)" >&2
        mkdir -p "$dir/apt/lists/partial" "$dir/apt/cache/archives/partial"
        echo "deb [arch=amd64] http://deb.debian.org/debian trixie main" >"$dir/apt/sources.list"
        apt_opts=(-o "Dir::Etc::SourceList=$dir/apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
            -o "Dir::State::Lists=$dir/apt/lists" -o "Dir::Cache=$dir/apt/cache"
            -o APT::Sandbox::User=root)
        apt-get "${apt_opts[@]}" update -qq >&2
        (cd "$dir/apt" && apt-get "${apt_opts[@]}" download qemu-user/trixie >&2)
        dpkg-deb -x "$dir"/apt/qemu-user_*.deb "$dir"
        rm -rf "$dir/apt"
    fi
    ("$dir/usr/bin/qemu-aarch64" -cpu help || true) | grep -qw -- "$model" || {
        echo "aarch64-toolchain: no qemu-aarch64 here emulates -cpu $model" >&2
        return 1
    }
    echo "$dir/usr/bin/qemu-aarch64"
}
