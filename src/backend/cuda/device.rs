//! An opened device: its context and every kernel compiled (or taken from the PTX cache) for
//! its own architecture and loaded.

use super::cache::{cache_dir, cached_ptx};
use super::kernels::FILES;
use super::no_panic;
use super::nvrtc::nvrtc_version;
use super::probe::{driver_version, probe, DeviceInfo};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::Ptx;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

pub struct CudaDevice {
    pub info: DeviceInfo,
    pub ctx: Arc<CudaContext>,
    functions: HashMap<&'static str, CudaFunction>,
    /// Kept alive for the functions loaded from them.
    _modules: Vec<Arc<CudaModule>>,
}

impl CudaDevice {
    /// Probes device `ordinal`, compiles every kernel file for it (through the PTX cache) and
    /// loads the modules. Logs one info line with what it found and how long it took.
    pub fn open(ordinal: usize) -> Result<CudaDevice, String> {
        let start = Instant::now();
        let info = probe(ordinal)?;
        let nvrtc = nvrtc_version()?;
        let driver = driver_version()?.to_string();
        let dir = cache_dir();
        no_panic("CUDA module loading failed", || {
            let ctx = CudaContext::new(ordinal)
                .map_err(|e| format!("cannot create a CUDA context: {e:?}"))?;
            let mut functions = HashMap::new();
            let mut modules = Vec::new();
            let mut hits = 0;
            for file in FILES {
                let (ptx, hit) = cached_ptx(dir.as_deref(), file, info.arch, &nvrtc, &driver)?;
                hits += hit as usize;
                let module = ctx.load_module(Ptx::from_src(ptx)).map_err(|e| {
                    format!(
                        "the driver cannot load kernels/{}.cu for {}: {e:?}",
                        file.name, info.arch
                    )
                })?;
                for &name in file.functions {
                    let f = module
                        .load_function(name)
                        .map_err(|e| format!("kernel {name} missing from its module: {e:?}"))?;
                    functions.insert(name, f);
                }
                modules.push(module);
            }
            log::info!(
                "CUDA: {} kernels from {} files for {} ({} from the PTX cache{}) in {:.2} s",
                functions.len(),
                FILES.len(),
                info.arch,
                hits,
                dir.as_ref()
                    .map(|d| format!(" in {}", d.display()))
                    .unwrap_or_else(|| ", none configured".into()),
                start.elapsed().as_secs_f64()
            );
            Ok(CudaDevice {
                info: info.clone(),
                ctx,
                functions,
                _modules: modules,
            })
        })
    }

    /// A loaded kernel by its `extern "C"` name.
    pub fn function(&self, name: &str) -> Option<&CudaFunction> {
        self.functions.get(name)
    }
}
