//! Which x86-64 extensions the build host has, as cfgs (`host_avx2`, `host_avx512vnni`,
//! `host_avxvnni`), so
//! that a test of a kernel this machine cannot run is marked ignored (and counted as such)
//! instead of passing without having checked anything. The tests are run where they are built;
//! each one still checks the CPU at run time before calling a kernel, so a binary carried to
//! another machine fails with a message rather than an illegal instruction.
//!
//! The flags mirror `crate::cpu_features`: `host_avx2` is AVX2 + FMA + F16C, `host_avx512vnni`
//! is that plus AVX-512 F, VL, BW and VNNI, `host_avxvnni` is `host_avx2` plus AVX-VNNI. Nothing is emitted for another target (a cross
//! build for aarch64 runs this script on an x86 host), and no code outside tests reads them.

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    for cfg in ["host_avx2", "host_avx512vnni", "host_avxvnni"] {
        println!("cargo::rustc-check-cfg=cfg({cfg})");
    }
    if std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("x86_64") {
        for cfg in x86_host_features() {
            println!("cargo::rustc-cfg={cfg}");
        }
    }
}

/// The cfgs this (x86-64) build host earns.
#[cfg(target_arch = "x86_64")]
fn x86_host_features() -> Vec<&'static str> {
    use std::arch::is_x86_feature_detected as has;
    let avx2 = has!("avx2") && has!("fma") && has!("f16c");
    let avx512vnni =
        avx2 && has!("avx512f") && has!("avx512vl") && has!("avx512bw") && has!("avx512vnni");
    let mut cfgs = Vec::new();
    if avx2 {
        cfgs.push("host_avx2");
    }
    if avx2 && has!("avxvnni") {
        cfgs.push("host_avxvnni");
    }
    if avx512vnni {
        cfgs.push("host_avx512vnni");
    }
    cfgs
}

/// A build host of another architecture cannot tell what an x86-64 CPU has: none.
#[cfg(not(target_arch = "x86_64"))]
fn x86_host_features() -> Vec<&'static str> {
    Vec::new()
}
