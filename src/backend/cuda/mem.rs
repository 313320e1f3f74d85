//! Raw device memory for the forward pass: buffers the executor allocates once at start-up and
//! addresses by plain device pointers.
//!
//! Why not cudarc's `CudaSlice`: every slice carries read/write events that its kernel-argument
//! impls record on each launch, and recording events on a stream that is being captured into a
//! CUDA graph is not what a decode graph should contain; the zero-copy weights are not a
//! cudarc allocation at all. So the forward pass passes `u64` device pointers to kernels, and
//! this file owns the few allocations behind them.

use cudarc::driver::sys::{CUdeviceptr, CUstream};
use cudarc::driver::{result, CudaContext};
use std::sync::Arc;

/// One device allocation, freed on drop.
pub struct DeviceBuf {
    ctx: Arc<CudaContext>,
    ptr: CUdeviceptr,
    bytes: usize,
}

impl DeviceBuf {
    /// Allocates `bytes` (at least 1) of device memory, zero-filled.
    pub fn zeroed(ctx: &Arc<CudaContext>, bytes: usize) -> Result<DeviceBuf, String> {
        let bytes = bytes.max(1);
        ctx.bind_to_thread()
            .map_err(|e| format!("cannot use the CUDA context: {e:?}"))?;
        // SAFETY: a plain allocation in the current context; freed once, in Drop.
        let ptr = unsafe { result::malloc_sync(bytes) }
            .map_err(|e| format!("cannot allocate {} MiB on the device: {e:?}", bytes >> 20))?;
        let buf = DeviceBuf {
            ctx: ctx.clone(),
            ptr,
            bytes,
        };
        // SAFETY: `ptr` points to `bytes` bytes just allocated.
        unsafe { result::memset_d8_sync(ptr, 0, bytes) }
            .map_err(|e| format!("cannot clear device memory: {e:?}"))?;
        Ok(buf)
    }

    /// A device copy of `data`.
    pub fn from_host<T: Copy>(ctx: &Arc<CudaContext>, data: &[T]) -> Result<DeviceBuf, String> {
        let buf = DeviceBuf::zeroed(ctx, std::mem::size_of_val(data))?;
        if !data.is_empty() {
            // SAFETY: the buffer holds at least size_of_val(data) bytes.
            unsafe { result::memcpy_htod_sync(buf.ptr, data) }
                .map_err(|e| format!("cannot copy to the device: {e:?}"))?;
        }
        Ok(buf)
    }

    pub fn ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for DeviceBuf {
    fn drop(&mut self) {
        // The engine thread may not be the one that allocated: make the context current.
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by malloc_sync in this context and freed only here.
            let _ = unsafe { result::free_sync(self.ptr) };
        }
    }
}

/// Copies `src` to device address `dst` in stream order. The host data is staged by the
/// driver before this returns (pageable memory), so `src` may be reused at once.
///
/// # Safety
/// `dst` must have room for `size_of_val(src)` bytes.
pub unsafe fn upload<T: Copy>(stream: CUstream, dst: CUdeviceptr, src: &[T]) -> Result<(), String> {
    if src.is_empty() {
        return Ok(());
    }
    result::memcpy_htod_async(dst, src, stream).map_err(|e| format!("host-to-device copy: {e:?}"))
}

/// Copies device bytes at `src` into `dst` after everything queued on the stream, and waits.
///
/// # Safety
/// `src` must hold `size_of_val(dst)` readable bytes.
pub unsafe fn download<T: Copy>(
    stream: CUstream,
    dst: &mut [T],
    src: CUdeviceptr,
) -> Result<(), String> {
    if dst.is_empty() {
        return Ok(());
    }
    result::memcpy_dtoh_async(dst, src, stream)
        .map_err(|e| format!("device-to-host copy: {e:?}"))?;
    result::stream::synchronize(stream).map_err(|e| format!("CUDA stream failed: {e:?}"))
}
