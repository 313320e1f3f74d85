//! The model's weights where the GPU can read them.
//!
//! Integrated GPUs (Jetson: the device reports `INTEGRATED`) share the box's one memory with
//! the CPU, so copying would hold the model twice: there the memory-mapped GGUF file is
//! registered with the driver (`cuMemHostRegister`, read-only, device-mapped) and the kernels
//! read it in place. Discrete GPUs get the file's tensor data copied to device memory once.
//! Either way a tensor's device address is the data region's base plus the tensor's offset in
//! the file, so the kernels see the same GGUF blocks the CPU reads.
//!
//! The norm weights and biases the CPU keeps as f32 vectors are uploaded as they are; biases
//! are repeated for `max_tokens` rows so that one `add_inplace` adds them to a whole batch.

use super::launch::matmul_kernel;
use super::mem::DeviceBuf;
use crate::gguf::GgufFile;
use crate::model::{Mat, Model};
use crate::quant::GgmlType;
use cudarc::driver::sys::{self, CUdeviceptr};
use cudarc::driver::CudaContext;
use std::sync::Arc;

/// Why `model` cannot run on the CUDA kernels, or `Ok` when it can.
pub fn check_supported(model: &Model) -> Result<(), String> {
    let c = &model.config;
    if c.head_dim != 64 && c.head_dim != 128 {
        return Err(format!(
            "head_dim {} (the attention kernels take 64 or 128)",
            c.head_dim
        ));
    }
    if c.n_head / c.n_head_kv > 8 {
        return Err(format!(
            "{} query heads per KV head (the attention kernel takes at most 8)",
            c.n_head / c.n_head_kv
        ));
    }
    let w = &model.weights;
    let mut mats: Vec<&Mat> = vec![&w.output];
    for l in &w.layers {
        mats.extend([&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down]);
    }
    let mut bad: Vec<String> = mats
        .iter()
        .filter(|m| matmul_kernel(m.ty, 1).is_none())
        .map(|m| format!("{} ({})", m.name, m.ty))
        .collect();
    use GgmlType::*;
    if !matches!(
        w.token_embd.ty,
        F32 | F16 | BF16 | Q4_0 | Q4_1 | Q8_0 | Q4_K | Q6_K
    ) {
        bad.push(format!("{} ({})", w.token_embd.name, w.token_embd.ty));
    }
    if !bad.is_empty() {
        bad.truncate(4);
        return Err(format!(
            "no CUDA kernel for the weight types of {}",
            bad.join(", ")
        ));
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
    /// Keeps the memory map alive while the driver has it registered.
    _file: Arc<GgufFile>,
    /// Device address of byte 0 of the GGUF file (for a copy: a virtual base, never
    /// dereferenced below the data offset).
    base: CUdeviceptr,
    /// Host address of byte 0 of the file, to turn a tensor slice into its offset.
    host_base: usize,
    pub zero_copy: bool,
    /// Device bytes the weights took (0 when read in place).
    pub device_bytes: usize,
    pub layers: Vec<LayerVectors>,
    pub output_norm: DeviceBuf,
}

/// One layer's f32 vectors on the device.
pub struct LayerVectors {
    pub attn_norm: DeviceBuf,
    pub ffn_norm: DeviceBuf,
    /// Biases repeated for `max_tokens` rows (qwen2); `None` where the model has none.
    pub bq: Option<DeviceBuf>,
    pub bk: Option<DeviceBuf>,
    pub bv: Option<DeviceBuf>,
}

// SAFETY: the raw host pointer is only handed back to cuMemHostUnregister; the mapping it
// points into is owned by the model's GgufFile, which outlives the executor.
unsafe impl Send for DeviceWeights {}

impl DeviceWeights {
    /// Makes `model`'s weights readable by the device: in place when `integrated` (falling back
    /// to a copy, with a log line, when the driver refuses the registration), else copied.
    pub fn new(
        ctx: &Arc<CudaContext>,
        model: &Model,
        integrated: bool,
        max_tokens: usize,
    ) -> Result<DeviceWeights, String> {
        ctx.bind_to_thread()
            .map_err(|e| format!("cannot use the CUDA context: {e:?}"))?;
        let bytes = model.file.bytes();
        let host_base = bytes.as_ptr() as usize;
        let data_offset = model.file.data_offset() as usize;
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
        let w = &model.weights;
        let repeat = |b: &Option<Vec<f32>>| -> Result<Option<DeviceBuf>, String> {
            b.as_ref()
                .map(|v| {
                    let rows: Vec<f32> = v
                        .iter()
                        .copied()
                        .cycle()
                        .take(v.len() * max_tokens)
                        .collect();
                    DeviceBuf::from_host(ctx, &rows)
                })
                .transpose()
        };
        let mut layers = Vec::with_capacity(w.layers.len());
        for l in &w.layers {
            layers.push(LayerVectors {
                attn_norm: DeviceBuf::from_host(ctx, &l.attn_norm)?,
                ffn_norm: DeviceBuf::from_host(ctx, &l.ffn_norm)?,
                bq: repeat(&l.bq)?,
                bk: repeat(&l.bk)?,
                bv: repeat(&l.bv)?,
            });
        }
        Ok(DeviceWeights {
            region,
            _file: model.file.clone(),
            base,
            host_base,
            zero_copy,
            device_bytes,
            layers,
            output_norm: DeviceBuf::from_host(ctx, &w.output_norm)?,
        })
    }

    /// Device address of `m`'s first block.
    pub fn ptr(&self, model: &Model, m: &Mat) -> CUdeviceptr {
        let off = m.data(&model.file).as_ptr() as usize - self.host_base;
        self.base + off as u64
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
