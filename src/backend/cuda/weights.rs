//! The model's weights where the GPU can read them.
//!
//! Integrated GPUs (Jetson: the device reports `INTEGRATED`) share the box's one memory with
//! the CPU, so copying would hold the model twice: there the memory-mapped GGUF file is
//! registered with the driver (`cuMemHostRegister`, read-only, device-mapped) and the kernels
//! read it in place. Discrete GPUs get the file's tensor data copied to device memory once.
//! Either way a tensor's device address is the data region's base plus the tensor's offset in
//! the file, so the kernels see the same GGUF blocks the CPU reads.
//!
//! The f32 vectors (norm weights, biases) live in the model's arena; it is uploaded once, and a
//! `VecRef` is an offset into it on the device as on the host.

use super::launch::{matmul_kernel, moe_gemv_kernel};
use super::mem::DeviceBuf;
use super::ops::{CONV_MAX_TAPS, DELTA_HEAD_DIMS};
use crate::backend::ops::{Experts, Mat, Network, VecRef};
use crate::gguf::GgufFile;
use crate::quant::GgmlType;
use cudarc::driver::sys::{self, CUdeviceptr};
use cudarc::driver::CudaContext;
use std::sync::Arc;

/// Head sizes the attention kernels are built for (kernels/attention.cu).
pub const HEAD_DIMS: [usize; 3] = [64, 128, 256];

/// Query heads per KV head the attention kernel takes at most (kernels/attention.cu
/// `ATT_MAX_REP`, `ATT_MAX_REP_D256`): its per-head accumulators live in registers.
pub fn max_query_heads_per_kv_head(head_dim: usize) -> usize {
    if head_dim >= 256 {
        4
    } else {
        8
    }
}

/// Why `net` cannot run on the CUDA kernels, or `Ok` when it can.
pub fn check_supported(net: &impl Network) -> Result<(), String> {
    let s = net.shape();
    if !s.causal {
        return Err(
            "bidirectional attention (an encoder such as bert, or gemma-embedding with its \
             symmetric windows), which the CUDA kernels do not implement; serve it with \
             --backend cpu"
                .into(),
        );
    }
    check_recurrent(s)?;
    let experts = net.expert_layers();
    for x in &experts {
        check_experts(x)?;
    }
    if !HEAD_DIMS.contains(&s.head_dim) {
        return Err(format!(
            "head_dim {} (the attention kernels take {HEAD_DIMS:?})",
            s.head_dim
        ));
    }
    let max_rep = max_query_heads_per_kv_head(s.head_dim);
    if s.n_head_kv == 0 || !s.n_head.is_multiple_of(s.n_head_kv) || s.n_head / s.n_head_kv > max_rep
    {
        return Err(format!(
            "{} query heads for {} KV heads (the attention kernel takes at most {max_rep} per \
             KV head at head_dim {})",
            s.n_head, s.n_head_kv, s.head_dim
        ));
    }
    if !s.n_rot.is_multiple_of(2) || s.n_rot > s.head_dim {
        return Err(format!(
            "RoPE over {} of {} dimensions",
            s.n_rot, s.head_dim
        ));
    }
    // The experts' matrices go through their own kernels (checked above); f32 matrices (a
    // DeltaNet's small β and α projections) through the f32 product of moe.cu.
    let expert_mats: Vec<&Mat> = experts.iter().flat_map(|x| x.matrices()).collect();
    let mut bad: Vec<String> = net
        .matrices()
        .iter()
        .filter(|m| !expert_mats.contains(m))
        .filter(|m| m.ty != GgmlType::F32 && matmul_kernel(m.ty, 1).is_none())
        .map(|m| format!("{} ({})", m.name, m.ty))
        .collect();
    use GgmlType::*;
    let e = net.embedding();
    if !matches!(
        e.ty,
        F32 | F16 | BF16 | Q4_0 | Q4_1 | Q5_0 | Q8_0 | Q4_K | Q6_K
    ) {
        bad.push(format!("{} ({})", e.name, e.ty));
    }
    if !bad.is_empty() {
        bad.sort();
        bad.dedup();
        bad.truncate(4);
        return Err(format!(
            "no CUDA kernel for the weight types of {}",
            bad.join(", ")
        ));
    }
    Ok(())
}

/// Why a hybrid's recurrent layers cannot run on kernels/recurrent.cu: a convolution longer
/// than its registers hold, or DeltaNet heads of a size without a `delta_rule_d*` kernel.
fn check_recurrent(s: &crate::backend::ops::Shape) -> Result<(), String> {
    let taps = s.delta_net.map_or(0, |d| d.taps).max(s.conv_taps);
    if taps > CONV_MAX_TAPS {
        return Err(format!(
            "a convolution of {taps} positions (the CUDA kernels take at most {CONV_MAX_TAPS})"
        ));
    }
    if let Some(d) = s.delta_net {
        if !DELTA_HEAD_DIMS.contains(&d.head_dim) {
            return Err(format!(
                "gated DeltaNet heads of {} (the CUDA kernels take {DELTA_HEAD_DIMS:?})",
                d.head_dim
            ));
        }
    }
    Ok(())
}

/// Why a mixture-of-experts FFN cannot run on the expert kernels: the router must be f32 or
/// have a matmul; each of gate, up and down must be one tensor of a type with a `moe_gemv_*`
/// kernel, cut into one band of rows per expert in expert order (the kernels find expert e's
/// matrix e bands past the first), and the experts' biases likewise one row per expert.
fn check_experts(x: &Experts) -> Result<(), String> {
    let r = &x.router;
    if r.ty != GgmlType::F32 && matmul_kernel(r.ty, 1).is_none() {
        return Err(format!(
            "no CUDA kernel for the router {} ({})",
            r.name, r.ty
        ));
    }
    for mats in [&x.gate, &x.up, &x.down] {
        let first = &mats[0];
        if moe_gemv_kernel(first.ty).is_none() {
            return Err(format!(
                "no CUDA expert kernel for {} ({})",
                first.name, first.ty
            ));
        }
        let banded = mats.iter().enumerate().all(|(e, m)| {
            m.tensor == first.tensor
                && m.ty == first.ty
                && (m.rows, m.cols) == (first.rows, first.cols)
                && m.first_row == first.first_row + e * first.rows
        });
        if !banded {
            return Err(format!(
                "the experts of {} are not one band of rows each in expert order",
                first.name
            ));
        }
    }
    if let Some(b) = &x.biases {
        let rowwise = |f: fn(&crate::backend::ops::ExpertBiases) -> VecRef| {
            let first = f(&b[0]);
            b.iter().enumerate().all(|(e, v)| {
                let v = f(v);
                v.len == first.len && v.offset == first.offset + e * first.len
            })
        };
        if !(rowwise(|v| v.gate) && rowwise(|v| v.up) && rowwise(|v| v.down)) {
            return Err("the experts' biases are not one row per expert in expert order".into());
        }
    }
    Ok(())
}

/// How the weight bytes reach the device.
enum Region {
    /// The mapped file, registered with the driver (zero-copy); unregistered on drop.
    Registered { host: *mut std::ffi::c_void },
    /// A device copy of the file's tensor data (held to keep it allocated).
    Copied { _buf: DeviceBuf },
}

pub struct DeviceWeights {
    region: Region,
    /// Keeps the memory map alive while the driver has it registered (and finds tensors).
    file: Arc<GgufFile>,
    /// Device address of byte 0 of the GGUF file (for a copy: a virtual base, never
    /// dereferenced below the data offset).
    base: CUdeviceptr,
    /// Host address of byte 0 of the file, to turn a tensor slice into its offset.
    host_base: usize,
    pub zero_copy: bool,
    /// Device bytes the weights took (0 when read in place).
    pub device_bytes: usize,
    /// The model's vector arena.
    arena: DeviceBuf,
}

// SAFETY: the raw host pointer is only handed back to cuMemHostUnregister; the mapping it
// points into is owned by the model's GgufFile, which outlives the executor.
unsafe impl Send for DeviceWeights {}

impl DeviceWeights {
    /// Makes `net`'s weights readable by the device: in place when `integrated` (falling back
    /// to a copy, with a log line, when the driver refuses the registration), else copied.
    pub fn new(
        ctx: &Arc<CudaContext>,
        net: &impl Network,
        integrated: bool,
    ) -> Result<DeviceWeights, String> {
        ctx.bind_to_thread()
            .map_err(|e| format!("cannot use the CUDA context: {e:?}"))?;
        let file = net.file();
        let bytes = file.bytes();
        let host_base = bytes.as_ptr() as usize;
        let data_offset = file.data_offset() as usize;
        let mut registered = None;
        if integrated {
            match register(bytes) {
                Ok(r) => registered = Some(r),
                Err(e) => log::warn!(
                    "CUDA: cannot read the weights in place ({e}); copying them to device memory"
                ),
            }
        }
        let (region, base, zero_copy, device_bytes) = match registered {
            Some((host, dev)) => {
                log::info!(
                    "CUDA: integrated GPU reads the {} MiB memory-mapped model in place \
                     (zero-copy, cuMemHostRegister read-only)",
                    bytes.len() >> 20
                );
                (Region::Registered { host }, dev, true, 0)
            }
            None => {
                let data = &bytes[data_offset..];
                let buf = DeviceBuf::from_host(ctx, data)?;
                let base = buf.ptr().wrapping_sub(data_offset as u64);
                log::info!(
                    "CUDA: {} MiB of weights copied to device memory",
                    data.len() >> 20
                );
                let n = buf.bytes();
                (Region::Copied { _buf: buf }, base, false, n)
            }
        };
        // One float at least: a model with no vectors still gets a valid buffer.
        let arena = if net.arena().is_empty() {
            DeviceBuf::from_host(ctx, &[0f32])?
        } else {
            DeviceBuf::from_host(ctx, net.arena())?
        };
        Ok(DeviceWeights {
            region,
            file: file.clone(),
            base,
            host_base,
            zero_copy,
            device_bytes,
            arena,
        })
    }

    /// Device address of `m`'s first block.
    pub fn mat(&self, m: &Mat) -> CUdeviceptr {
        let off = m.data(&self.file).as_ptr() as usize - self.host_base;
        self.base + off as u64
    }

    /// Device address of the vector `v`.
    pub fn vec(&self, v: VecRef) -> CUdeviceptr {
        self.arena.ptr() + (v.offset * 4) as u64
    }
}

impl Drop for DeviceWeights {
    fn drop(&mut self) {
        if let Region::Registered { host } = self.region {
            // SAFETY: registered by `register` and unregistered only here.
            let _ = unsafe { sys::cuMemHostUnregister(host) };
        }
    }
}

/// Registers `bytes` (page-aligned start: a memory map) read-only and device-mapped; returns
/// the registered host pointer and the device address of `bytes[0]`.
fn register(bytes: &[u8]) -> Result<(*mut std::ffi::c_void, CUdeviceptr), String> {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
    let host = bytes.as_ptr() as *mut std::ffi::c_void;
    if !(host as usize).is_multiple_of(page) {
        return Err("the model is not page-aligned in memory (not memory-mapped?)".into());
    }
    // A mapping covers whole pages, so the rounded length stays inside it.
    let len = bytes.len().div_ceil(page) * page;
    let flags = sys::CU_MEMHOSTREGISTER_DEVICEMAP | sys::CU_MEMHOSTREGISTER_READ_ONLY;
    // SAFETY: [host, host + len) is the file's mapping, alive as long as the model (which the
    // executor's owner keeps); the driver only reads it (READ_ONLY).
    let r = unsafe { sys::cuMemHostRegister_v2(host, len, flags) };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(format!("cuMemHostRegister failed: {r:?}"));
    }
    let mut dev: CUdeviceptr = 0;
    // SAFETY: `host` was just registered with DEVICEMAP.
    let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, host, 0) };
    if r != sys::CUresult::CUDA_SUCCESS {
        // SAFETY: registered just above.
        unsafe { sys::cuMemHostUnregister(host) };
        return Err(format!("cuMemHostGetDevicePointer failed: {r:?}"));
    }
    Ok((host, dev))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::ops::ExpertBiases;

    fn band(name: &str, ty: GgmlType, e: usize) -> Mat {
        Mat {
            name: name.into(),
            ty,
            cols: 64,
            rows: 32,
            tensor: 7,
            first_row: 32 * e,
        }
    }

    fn experts(ty: GgmlType) -> Experts {
        let all = |name: &str| (0..4).map(|e| band(name, ty, e)).collect::<Vec<_>>();
        Experts {
            router: Mat {
                name: "router".into(),
                ty: GgmlType::F32,
                cols: 64,
                rows: 4,
                tensor: 3,
                first_row: 0,
            },
            router_bias: None,
            biases: None,
            gate: all("gate"),
            up: all("up"),
            down: all("down"),
        }
    }

    #[test]
    fn expert_kernels_take_banded_tensors_of_their_types() {
        assert_eq!(check_experts(&experts(GgmlType::MXFP4)), Ok(()));
        assert_eq!(check_experts(&experts(GgmlType::Q4_K)), Ok(()));
        let why = check_experts(&experts(GgmlType::F16)).unwrap_err();
        assert!(
            why.contains("no CUDA expert kernel for gate (F16)"),
            "{why}"
        );

        let mut x = experts(GgmlType::Q8_0);
        x.router.ty = GgmlType::BF16;
        let why = check_experts(&x).unwrap_err();
        assert!(why.contains("router"), "{why}");

        // Experts out of order: the kernels would read expert 1's rows for expert 2.
        let mut x = experts(GgmlType::Q8_0);
        x.up.swap(1, 2);
        let why = check_experts(&x).unwrap_err();
        assert!(why.contains("up") && why.contains("band"), "{why}");

        let bias = |offset: usize| VecRef { offset, len: 32 };
        let mut x = experts(GgmlType::Q8_0);
        x.biases = Some(
            (0..4)
                .map(|e| ExpertBiases {
                    gate: bias(32 * e),
                    up: bias(1000 + 32 * e),
                    down: bias(2000 + 32 * e),
                })
                .collect(),
        );
        assert_eq!(check_experts(&x), Ok(()));
        x.biases.as_mut().unwrap()[3].down = bias(5000);
        let why = check_experts(&x).unwrap_err();
        assert!(why.contains("biases"), "{why}");
    }
}
