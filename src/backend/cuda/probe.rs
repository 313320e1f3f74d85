//! Is there a usable CUDA device, and what is it? Every failure is an error string that says
//! why (no driver library, no device, driver too old, ...), for one clear log line.

use super::no_panic;
use super::nvrtc::Arch;
use cudarc::driver::result;
use cudarc::driver::sys::CUdevice_attribute as Attr;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    pub arch: Arch,
    /// Shares memory with the CPU (Jetson): weights can be read in place, not copied.
    pub integrated: bool,
    pub multiprocessors: u32,
    pub free_bytes: usize,
    pub total_bytes: usize,
    /// `cuDriverGetVersion`, e.g. 12060 for CUDA 12.6.
    pub driver_version: i32,
}

impl DeviceInfo {
    /// One line for logs: `Orin (sm_87, integrated, 8 SMs, 5120 MiB free of 7620 MiB, driver 12.6)`.
    pub fn summary(&self) -> String {
        format!(
            "{} ({}, {}, {} SMs, {} MiB free of {} MiB, driver {}.{})",
            self.name,
            self.arch,
            if self.integrated {
                "integrated"
            } else {
                "discrete"
            },
            self.multiprocessors,
            self.free_bytes >> 20,
            self.total_bytes >> 20,
            self.driver_version / 1000,
            self.driver_version % 1000 / 10,
        )
    }
}

/// Looks for device `ordinal`. Never panics, also not when libcuda is absent.
pub fn probe(ordinal: usize) -> Result<DeviceInfo, String> {
    no_panic("the CUDA driver library could not be used", || {
        // SAFETY: only asks whether the library could be loaded.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err("libcuda.so not found: no NVIDIA driver installed".into());
        }
        result::init().map_err(|e| format!("cuInit failed: {}", driver_error(e)))?;
        let count = result::device::get_count()
            .map_err(|e| format!("cuDeviceGetCount failed: {}", driver_error(e)))?;
        if count <= 0 {
            return Err("the driver reports no CUDA device".into());
        }
        if ordinal >= count as usize {
            return Err(format!(
                "no CUDA device {ordinal} (the driver reports {count})"
            ));
        }
        let dev = result::device::get(ordinal as i32)
            .map_err(|e| format!("cuDeviceGet failed: {}", driver_error(e)))?;
        let name = result::device::get_name(dev).unwrap_or_else(|_| "unknown GPU".into());
        let attr = |a: Attr| -> Result<i32, String> {
            // SAFETY: `dev` is a valid device handle from cuDeviceGet.
            unsafe { result::device::get_attribute(dev, a) }
                .map_err(|e| format!("cuDeviceGetAttribute({a:?}) failed: {}", driver_error(e)))
        };
        let major = attr(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = attr(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let integrated = attr(Attr::CU_DEVICE_ATTRIBUTE_INTEGRATED)? != 0;
        let multiprocessors = attr(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        if major < 6 || (major == 6 && minor < 1) {
            return Err(format!(
                "{name} is sm_{major}{minor}: the kernels need sm_61 or newer (dp4a)"
            ));
        }
        let driver_version = driver_version()?;
        // Free memory needs a context: the device's primary one, released when `ctx` drops.
        let ctx = cudarc::driver::CudaContext::new(ordinal)
            .map_err(|e| format!("cannot create a CUDA context: {}", driver_error(e)))?;
        ctx.bind_to_thread()
            .map_err(|e| format!("cannot use the CUDA context: {}", driver_error(e)))?;
        let (free_bytes, total_bytes) = result::mem_get_info()
            .map_err(|e| format!("cuMemGetInfo failed: {}", driver_error(e)))?;
        Ok(DeviceInfo {
            ordinal,
            name,
            arch: Arch::new(major as u32, minor as u32),
            integrated,
            multiprocessors: multiprocessors as u32,
            free_bytes,
            total_bytes,
            driver_version,
        })
    })
}

/// `cuDriverGetVersion` (works before cuInit).
pub(crate) fn driver_version() -> Result<i32, String> {
    let mut v = 0i32;
    // SAFETY: writes one int.
    let r = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) };
    if r != cudarc::driver::sys::CUresult::CUDA_SUCCESS {
        return Err(format!("cuDriverGetVersion failed: {r:?}"));
    }
    Ok(v)
}

/// CUDA_ERROR_NO_DEVICE and friends in words.
fn driver_error(e: cudarc::driver::DriverError) -> String {
    use cudarc::driver::sys::CUresult::*;
    match e.0 {
        CUDA_ERROR_NO_DEVICE => "no CUDA-capable device is detected".into(),
        CUDA_ERROR_SYSTEM_DRIVER_MISMATCH => {
            "the NVIDIA kernel module and libcuda are different versions".into()
        }
        CUDA_ERROR_NOT_INITIALIZED => "the CUDA driver is not initialized".into(),
        other => format!("{other:?}"),
    }
}
