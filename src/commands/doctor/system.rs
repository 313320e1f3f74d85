//! Host checks: CPU and SIMD, memory and swap, disk, NVIDIA GPU, Jetson / thermal / clocks.

use super::{human, Check, Context};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Swap in use beyond this means the box has been under memory pressure.
const SWAP_USED_WARN: u64 = 64 << 20;
/// A thermal zone at or above this (°C) is throttling or close to it.
const HOT_CELSIUS: f64 = 85.0;

pub fn cpu() -> Check {
    let mut c = Check::new("cpu");
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let name = cpu_model_name(&info)
        .or_else(|| read_trim("/proc/device-tree/model"))
        .unwrap_or_else(|| std::env::consts::ARCH.to_owned());
    let logical = info.lines().filter(|l| l.starts_with("processor")).count();
    let usable = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let features = simd_features();
    let found: Vec<&str> = features
        .iter()
        .filter(|(_, on)| *on)
        .map(|(n, _)| *n)
        .collect();
    let level = edgelm::quant::simd_level();
    let gemm = edgelm::quant::gemm_level();
    c.detail("model_name", name.clone());
    c.detail("logical_cpus", logical);
    c.detail("usable_cpus", usable);
    c.detail("arch", std::env::consts::ARCH);
    c.detail(
        "features",
        Value::Object(
            features
                .iter()
                .map(|(n, on)| (n.to_string(), Value::Bool(*on)))
                .collect(),
        ),
    );
    c.detail("kernel_level", level);
    c.detail("gemm_level", gemm);
    let reason = format!(
        "{name}, {usable} usable cores; {}; kernels: {level} (gemm panels: {gemm})",
        if found.is_empty() {
            "no SIMD features".to_owned()
        } else {
            found.join(" ")
        }
    );
    if level == "scalar" {
        c.warn(
            reason,
            "no SIMD kernels for this CPU: inference runs on the slow scalar path",
        )
    } else {
        c.pass(reason)
    }
}

fn cpu_model_name(cpuinfo: &str) -> Option<String> {
    ["model name", "Hardware", "Model"].iter().find_map(|key| {
        cpuinfo.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == *key && !v.trim().is_empty()).then(|| v.trim().to_owned())
        })
    })
}

fn simd_features() -> Vec<(&'static str, bool)> {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        vec![
            ("avx2", has!("avx2")),
            ("fma", has!("fma")),
            ("f16c", has!("f16c")),
            ("avx512f", has!("avx512f")),
            ("avx512vnni", has!("avx512vnni")),
            ("avxvnni", has!("avxvnni")),
        ]
    }
    #[cfg(target_arch = "aarch64")]
    {
        use std::arch::is_aarch64_feature_detected as has;
        vec![("neon", has!("neon")), ("dotprod", has!("dotprod"))]
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        Vec::new()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemInfo {
    pub total: u64,
    pub available: u64,
    pub swap_total: u64,
    pub swap_free: u64,
}

/// /proc/meminfo: values in kB; MemAvailable is required (kernels since 3.14 have it).
pub fn parse_meminfo(text: &str) -> Option<MemInfo> {
    let field = |name: &str| -> Option<u64> {
        text.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            if k.trim() != name {
                return None;
            }
            let mut parts = v.split_whitespace();
            let n: u64 = parts.next()?.parse().ok()?;
            Some(match parts.next() {
                Some("kB") => n * 1024,
                _ => n,
            })
        })
    };
    Some(MemInfo {
        total: field("MemTotal")?,
        available: field("MemAvailable")?,
        swap_total: field("SwapTotal").unwrap_or(0),
        swap_free: field("SwapFree").unwrap_or(0),
    })
}

pub fn read_meminfo() -> Option<MemInfo> {
    parse_meminfo(&std::fs::read_to_string("/proc/meminfo").ok()?)
}

pub fn memory(ctx: &Context) -> Check {
    let mut c = Check::new("memory");
    let Some(m) = ctx.mem else {
        return c.warn(
            "cannot read /proc/meminfo",
            "memory could not be checked on this system",
        );
    };
    let swap_used = m.swap_total.saturating_sub(m.swap_free);
    c.detail("mem_total_bytes", m.total);
    c.detail("mem_available_bytes", m.available);
    c.detail("swap_total_bytes", m.swap_total);
    c.detail("swap_used_bytes", swap_used);
    let mut reason = format!("{} total, {} available", human(m.total), human(m.available));
    if m.swap_total == 0 {
        reason.push_str(", no swap");
    } else {
        reason.push_str(&format!(
            ", swap {} ({} used)",
            human(m.swap_total),
            human(swap_used)
        ));
    }
    if swap_used > SWAP_USED_WARN {
        return c.warn(
            reason,
            "swap is in use: KV pages or buffers swapped out stall decoding; free memory, \
             lower engine.kv_memory_mib, or disable swap on a dedicated box",
        );
    }
    if m.available < m.total / 10 {
        return c.warn(
            reason,
            "less than 10% of memory is available: other processes compete with the model",
        );
    }
    c.pass(reason)
}

pub fn disk(ctx: &Context) -> Check {
    let mut c = Check::new("disk");
    // The filesystem holding the model (or the directory it would be in).
    let dir = ctx
        .model_path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    let probe = if ctx.model_path.exists() {
        ctx.model_path.clone()
    } else if dir.exists() {
        dir.clone()
    } else {
        PathBuf::from(".")
    };
    let Some((free, total, read_only)) = statvfs(&probe) else {
        return c.warn(
            format!("cannot statvfs {}", probe.display()),
            "free disk space could not be checked",
        );
    };
    c.detail("path", probe.display().to_string());
    c.detail("free_bytes", free);
    c.detail("total_bytes", total);
    c.detail("read_only", read_only);
    let reason = format!(
        "{} free of {} on the filesystem holding {}{}",
        human(free),
        human(total),
        probe.display(),
        if read_only { " (read-only)" } else { "" }
    );
    if free < 64 << 20 && !read_only {
        c.fail(
            reason,
            "the disk is full: logs and updates will fail; free space",
        )
    } else if free < 1 << 30 && !read_only {
        c.warn(
            reason,
            "less than 1 GiB free: logs and model updates need room",
        )
    } else {
        c.pass(reason)
    }
}

/// (free bytes for unprivileged users, total bytes, read-only).
fn statvfs(path: &Path) -> Option<(u64, u64, bool)> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: c_path is a valid NUL-terminated string and st a valid out-pointer.
    if unsafe { libc::statvfs(c_path.as_ptr(), &mut st) } != 0 {
        return None;
    }
    let frsize = st.f_frsize as u64;
    Some((
        st.f_bavail as u64 * frsize,
        st.f_blocks as u64 * frsize,
        st.f_flag & libc::ST_RDONLY != 0,
    ))
}

/// Runs a program with a deadline; None when it is missing, fails or hangs.
pub fn run_with_timeout(program: &str, args: &[&str], timeout: Duration) -> Option<String> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .ok()?;
    let mut stdout = child.stdout.take()?;
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut stdout, &mut s);
        s
    });
    let start = std::time::Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                let out = reader.join().ok()?;
                return status.success().then_some(out);
            }
            Ok(None) if start.elapsed() < timeout => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
}

fn read_trim(path: impl AsRef<Path>) -> Option<String> {
    let s = std::fs::read_to_string(path).ok()?;
    let s = s.trim_matches(|c: char| c.is_whitespace() || c == '\0');
    (!s.is_empty()).then(|| s.to_owned())
}

fn is_jetson() -> bool {
    Path::new("/etc/nv_tegra_release").exists()
        || read_trim("/proc/device-tree/compatible")
            .is_some_and(|s| s.contains("tegra") || s.contains("nvidia,p3"))
        || read_trim("/proc/device-tree/model").is_some_and(|s| s.contains("Jetson"))
}

pub fn gpu(ctx: &Context) -> Check {
    let mut c = Check::new("gpu");
    let backend = ctx.profile.engine.backend.as_str();
    c.detail("profile_backend", backend);
    c.detail("cuda_build", cfg!(feature = "cuda"));
    let driver = std::fs::read_to_string("/proc/driver/nvidia/version")
        .ok()
        .and_then(|s| s.lines().next().map(|l| l.trim().to_owned()));
    let devices = nvidia_device_nodes();
    let jetson = is_jetson();
    let gpus = query_nvidia_smi();
    if let Some(d) = &driver {
        c.detail("driver", d.clone());
    }
    c.detail("devices", devices.clone());
    c.detail("nvidia_smi", gpus.clone());
    c.detail("integrated", jetson);
    let present = driver.is_some() || !gpus.is_empty() || jetson || !devices.is_empty();
    if !present {
        let reason = "no NVIDIA GPU found".to_owned();
        return match backend {
            "cuda" => c.fail(
                reason,
                "the profile sets engine.backend = \"cuda\" but there is no GPU: install the \
                 driver or set backend = \"cpu\"",
            ),
            "auto" => c.warn(reason, "engine.backend = \"auto\" will serve on the CPU"),
            _ => c.pass(reason),
        };
    }
    let reason = gpu_summary(jetson, &gpus, driver.as_deref(), &devices);
    if backend != "cpu" && !cfg!(feature = "cuda") {
        return c.warn(
            reason,
            "this edgelm build has no CUDA backend: it serves on the CPU",
        );
    }
    if backend == "cuda" && driver.is_none() && !jetson {
        return c.fail(
            reason,
            "device nodes exist but no driver answers /proc/driver/nvidia/version",
        );
    }
    c.pass(reason)
}

/// The NVIDIA device nodes under /dev (a discrete GPU's `nvidia*`, a Jetson's `nvgpu` or
/// `nvhost-gpu`), sorted.
fn nvidia_device_nodes() -> Vec<String> {
    let mut devices: Vec<String> = std::fs::read_dir("/dev")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("nvidia") || n == "nvgpu" || n.starts_with("nvhost-gpu"))
                .collect()
        })
        .unwrap_or_default();
    devices.sort();
    devices
}

/// Each GPU `nvidia-smi` lists (none without it, or when it does not answer in 10 s).
fn query_nvidia_smi() -> Vec<Value> {
    let smi = run_with_timeout(
        "nvidia-smi",
        &[
            "--query-gpu=name,driver_version,memory.total,memory.free,compute_cap",
            "--format=csv,noheader,nounits",
        ],
        Duration::from_secs(10),
    );
    smi.as_deref().map(parse_nvidia_smi).unwrap_or_default()
}

/// The GPUs found, in one line: the integrated one, each `nvidia-smi` lists, the driver's
/// version; the device nodes when nothing else tells.
fn gpu_summary(jetson: bool, gpus: &[Value], driver: Option<&str>, devices: &[String]) -> String {
    let mut parts = Vec::new();
    if jetson {
        parts.push("integrated (Jetson) GPU".to_owned());
    }
    for g in gpus {
        parts.push(format!(
            "{} (sm {}, {} MiB free of {} MiB)",
            g["name"].as_str().unwrap_or("?"),
            g["compute_cap"].as_str().unwrap_or("?"),
            g["memory_free_mib"],
            g["memory_total_mib"],
        ));
    }
    if let Some(v) = driver.and_then(driver_version) {
        parts.push(format!("driver {v}"));
    } else if let Some(v) = gpus.first().and_then(|g| g["driver_version"].as_str()) {
        parts.push(format!("driver {v}"));
    }
    if parts.is_empty() {
        parts.push(format!("NVIDIA device nodes: {}", devices.join(" ")));
    }
    parts.join("; ")
}

/// "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar ..." -> "550.54.15".
fn driver_version(line: &str) -> Option<String> {
    line.split_whitespace()
        .find(|w| {
            w.contains('.')
                && w.split('.')
                    .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        })
        .map(str::to_owned)
}

fn parse_nvidia_smi(text: &str) -> Vec<Value> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split(',').map(str::trim).collect();
            let num = |i: usize| f.get(i).and_then(|s| s.parse::<u64>().ok());
            json!({
                "name": f.first().copied().unwrap_or(""),
                "driver_version": f.get(1).copied().unwrap_or(""),
                "memory_total_mib": num(2),
                "memory_free_mib": num(3),
                "compute_cap": f.get(4).copied().unwrap_or(""),
            })
        })
        .collect()
}

/// One thermal zone: its type and temperature in °C.
#[derive(Debug, Clone, PartialEq)]
pub struct Zone {
    pub name: String,
    pub celsius: f64,
}

/// A thermal zone's `temp`: millidegrees Celsius (some drivers report whole degrees).
pub fn parse_thermal_temp(s: &str) -> Option<f64> {
    let v: i64 = s.trim().parse().ok()?;
    // Values that small are degrees already; nothing on a running board is below 200 m°C.
    Some(if v.abs() < 200 {
        v as f64
    } else {
        v as f64 / 1000.0
    })
}

/// Every `thermal_zone*` under `root` (normally /sys/class/thermal) with a readable temp.
pub fn read_thermal_zones(root: &Path) -> Vec<Zone> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("thermal_zone"))
                })
                .collect()
        })
        .unwrap_or_default();
    dirs.sort_by_key(|p| {
        p.file_name()
            .and_then(|n| {
                n.to_string_lossy()["thermal_zone".len()..]
                    .parse::<u32>()
                    .ok()
            })
            .unwrap_or(u32::MAX)
    });
    dirs.iter()
        .filter_map(|d| {
            let celsius = parse_thermal_temp(&std::fs::read_to_string(d.join("temp")).ok()?)?;
            let name = read_trim(d.join("type")).unwrap_or_else(|| {
                d.file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned()
            });
            Some(Zone { name, celsius })
        })
        .collect()
}

/// "# R36 (release), REVISION: 3.0, GCID: ..., BOARD: generic, EABI: aarch64, DATE: ..." -> "R36.3.0".
pub fn parse_tegra_release(text: &str) -> Option<String> {
    let line = text.lines().find(|l| l.contains("REVISION"))?;
    let major = line.split_whitespace().find(|w| {
        w.starts_with('R') && w[1..].bytes().all(|b| b.is_ascii_digit()) && w.len() > 1
    })?;
    let rev = line
        .split(',')
        .find_map(|p| p.trim().strip_prefix("REVISION:"))?
        .trim();
    Some(format!("{major}.{rev}"))
}

/// Per-CPU current/max clocks (MHz) and governors from cpufreq.
fn cpufreq() -> Vec<Value> {
    let mut cpus: Vec<(u32, PathBuf)> = std::fs::read_dir("/sys/devices/system/cpu")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| {
                    let n = e.file_name().to_string_lossy().into_owned();
                    let id = n.strip_prefix("cpu")?.parse().ok()?;
                    let f = e.path().join("cpufreq");
                    f.exists().then_some((id, f))
                })
                .collect()
        })
        .unwrap_or_default();
    cpus.sort();
    let khz = |p: &Path, f: &str| {
        read_trim(p.join(f))
            .and_then(|s| s.parse::<u64>().ok())
            .map(|k| k / 1000)
    };
    cpus.iter()
        .map(|(id, p)| {
            json!({
                "cpu": id,
                "cur_mhz": khz(p, "scaling_cur_freq"),
                "max_mhz": khz(p, "scaling_max_freq"),
                "hw_max_mhz": khz(p, "cpuinfo_max_freq"),
                "governor": read_trim(p.join("scaling_governor")),
            })
        })
        .collect()
}

/// The CPU clocks `cpufreq` reports, in one line, and the governors in use (sorted, once each).
fn clock_summary(clocks: &[Value]) -> (String, Vec<String>) {
    let mut governors: Vec<String> = clocks
        .iter()
        .filter_map(|c| c["governor"].as_str().map(str::to_owned))
        .collect();
    governors.sort();
    governors.dedup();
    let cur: Vec<u64> = clocks
        .iter()
        .filter_map(|c| c["cur_mhz"].as_u64())
        .collect();
    let text = if cur.is_empty() {
        "no cpufreq".to_owned()
    } else {
        format!(
            "CPU clocks {}-{} MHz ({})",
            cur.iter().min().unwrap_or(&0),
            cur.iter().max().unwrap_or(&0),
            governors.join("/")
        )
    };
    (text, governors)
}

/// A Jetson's board, L4T release (from `release`, /etc/nv_tegra_release) and power mode, in
/// one line and as details of `c`.
fn jetson_board(c: &mut Check, release: Option<&str>) -> String {
    let l4t = release
        .and_then(parse_tegra_release)
        .unwrap_or_else(|| "L4T release unknown".into());
    let board = read_trim("/proc/device-tree/model").unwrap_or_else(|| "Jetson".into());
    c.detail("l4t", l4t.clone());
    c.detail("board", board.clone());
    let mode = run_with_timeout("nvpmodel", &["-q"], Duration::from_secs(5)).and_then(|s| {
        s.lines().find_map(|l| {
            l.strip_prefix("NV Power Mode:")
                .map(|m| m.trim().to_owned())
        })
    });
    if let Some(m) = &mode {
        c.detail("power_mode", m.clone());
    }
    format!(
        "{board}, {l4t}, power mode {}",
        mode.as_deref().unwrap_or("unknown (nvpmodel not found)")
    )
}

pub fn jetson() -> Check {
    let mut c = Check::new("jetson");
    let zones = read_thermal_zones(Path::new("/sys/class/thermal"));
    let clocks = cpufreq();
    c.detail(
        "thermal_zones",
        zones
            .iter()
            .map(|z| json!({"type": z.name, "celsius": z.celsius}))
            .collect::<Vec<_>>(),
    );
    c.detail("cpufreq", clocks.clone());
    let hottest = zones.iter().max_by(|a, b| a.celsius.total_cmp(&b.celsius));
    let thermal = match hottest {
        Some(z) => format!(
            "{} thermal zones, hottest {:.1} °C ({})",
            zones.len(),
            z.celsius,
            z.name
        ),
        None => "no thermal zones".to_owned(),
    };
    let (clock_text, governors) = clock_summary(&clocks);
    let release = std::fs::read_to_string("/etc/nv_tegra_release").ok();
    let jetson = release.is_some() || is_jetson();
    c.detail("is_jetson", jetson);
    let mut reason = match jetson {
        true => jetson_board(&mut c, release.as_deref()),
        false => "not a Jetson".to_owned(),
    };
    reason.push_str(&format!("; {thermal}; {clock_text}"));
    if let Some(z) = hottest.filter(|z| z.celsius >= HOT_CELSIUS) {
        return c.warn(
            reason,
            format!(
                "{} is at {:.1} °C: the SoC/CPU is throttling or close to it; check airflow, \
                 the fan and the enclosure",
                z.name, z.celsius
            ),
        );
    }
    if jetson && governors.iter().any(|g| g == "powersave") {
        return c.warn(
            reason,
            "CPU governor is powersave: decode runs at low clocks; use `nvpmodel` / \
             `jetson_clocks` for a performance mode",
        );
    }
    c.pass(reason)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_parses_kb_fields() {
        let text = "MemTotal:        8052740 kB\nMemFree:          123456 kB\n\
                    MemAvailable:    4026370 kB\nSwapTotal:       2097148 kB\nSwapFree:        1048574 kB\n";
        let m = parse_meminfo(text).unwrap();
        assert_eq!(m.total, 8052740 * 1024);
        assert_eq!(m.available, 4026370 * 1024);
        assert_eq!(m.swap_total, 2097148 * 1024);
        assert_eq!(m.swap_free, 1048574 * 1024);
        // MemAvailable is required; swap lines are optional.
        assert!(parse_meminfo("MemTotal: 100 kB\n").is_none());
        let m = parse_meminfo("MemTotal: 100 kB\nMemAvailable: 50 kB\n").unwrap();
        assert_eq!((m.swap_total, m.swap_free), (0, 0));
    }

    #[test]
    fn thermal_temps_and_zones() {
        assert_eq!(parse_thermal_temp("45500\n"), Some(45.5));
        assert_eq!(parse_thermal_temp("-40000"), Some(-40.0));
        assert_eq!(parse_thermal_temp("52"), Some(52.0));
        assert_eq!(parse_thermal_temp("n/a"), None);
        let root = std::env::temp_dir().join(format!("edgelm-thermal-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for (i, ty, temp) in [(10, "gpu-thermal", "61250"), (2, "cpu-thermal", "48000")] {
            let d = root.join(format!("thermal_zone{i}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("type"), format!("{ty}\n")).unwrap();
            std::fs::write(d.join("temp"), format!("{temp}\n")).unwrap();
        }
        // A zone without a readable temp is skipped.
        std::fs::create_dir_all(root.join("thermal_zone3")).unwrap();
        let zones = read_thermal_zones(&root);
        std::fs::remove_dir_all(&root).unwrap();
        assert_eq!(
            zones,
            vec![
                Zone {
                    name: "cpu-thermal".into(),
                    celsius: 48.0
                },
                Zone {
                    name: "gpu-thermal".into(),
                    celsius: 61.25
                },
            ]
        );
    }

    #[test]
    fn tegra_release_and_driver_version() {
        let t = "# R36 (release), REVISION: 3.0, GCID: 36191598, BOARD: generic, EABI: aarch64, DATE: Mon May  6 17:34:21 UTC 2024\n";
        assert_eq!(parse_tegra_release(t).as_deref(), Some("R36.3.0"));
        assert_eq!(parse_tegra_release("garbage"), None);
        let v = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024";
        assert_eq!(driver_version(v).as_deref(), Some("550.54.15"));
        let g = parse_nvidia_smi("NVIDIA H200, 550.54.15, 143771, 143000, 9.0\n");
        assert_eq!(g.len(), 1);
        assert_eq!(g[0]["memory_free_mib"], 143000);
        assert_eq!(g[0]["compute_cap"], "9.0");
    }

    #[test]
    fn cpuinfo_model_name() {
        let x86 = "processor\t: 0\nmodel name\t: AMD EPYC 7B13\n";
        assert_eq!(cpu_model_name(x86).as_deref(), Some("AMD EPYC 7B13"));
        assert_eq!(cpu_model_name("processor : 0\nBogoMIPS : 62.50\n"), None);
    }
}
