//! A served model's LoRA adapters: those loaded at start and those an administrator loads or
//! unloads while it serves. A request holds its adapter (an `Arc`) until it ends, so an
//! adapter unloaded mid-stream finishes the streams that use it and is freed after the last.

use crate::backend::adapter::Adapter;
use crate::config::LoraSection;
use crate::model::Model;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// One model's adapters, by name.
pub struct AdapterSet {
    /// The base they are checked against and applied to.
    model: Arc<Model>,
    state: RwLock<State>,
}

#[derive(Default)]
struct State {
    live: Vec<Arc<Adapter>>,
    /// Names unloaded since: a request naming one is refused rather than answered by the
    /// base model (which is what an unknown id gets when one model is served).
    unloaded: Vec<String>,
}

impl AdapterSet {
    /// The adapters `sections` names, each read and checked against `model`.
    pub fn open(model: Arc<Model>, sections: &[LoraSection]) -> anyhow::Result<AdapterSet> {
        let live = sections
            .iter()
            .map(|l| open_adapter(&model, l).map(Arc::new))
            .collect::<anyhow::Result<_>>()?;
        let state = RwLock::new(State {
            live,
            unloaded: Vec::new(),
        });
        Ok(AdapterSet { model, state })
    }

    /// The adapter called `name`.
    pub fn get(&self, name: &str) -> Option<Arc<Adapter>> {
        self.read().live.iter().find(|a| a.name == name).cloned()
    }

    /// Whether `name` was an adapter of this model, unloaded since.
    pub fn was_unloaded(&self, name: &str) -> bool {
        self.read().unloaded.iter().any(|n| n == name)
    }

    /// Every adapter loaded now, in the order they came.
    pub fn all(&self) -> Vec<Arc<Adapter>> {
        self.read().live.clone()
    }

    /// Reads `lora` and checks it against the model (a slow read, outside the lock).
    pub fn read_file(&self, lora: &LoraSection) -> anyhow::Result<Arc<Adapter>> {
        open_adapter(&self.model, lora).map(Arc::new)
    }

    /// Adds an adapter read by [`AdapterSet::read_file`] (its name checked free by the caller).
    pub fn insert(&self, adapter: Arc<Adapter>) {
        let mut state = self.write();
        state.unloaded.retain(|n| *n != adapter.name);
        state.live.push(adapter);
    }

    /// Takes the adapter called `name` out of the set; requests already holding it keep it.
    pub fn remove(&self, name: &str) -> Option<Arc<Adapter>> {
        let mut state = self.write();
        let at = state.live.iter().position(|a| a.name == name)?;
        let adapter = state.live.remove(at);
        state.unloaded.push(adapter.name.clone());
        Some(adapter)
    }

    fn read(&self) -> RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|e| e.into_inner())
    }
}

/// The adapter `lora` for `model`, read and checked against it.
fn open_adapter(model: &Model, lora: &LoraSection) -> anyhow::Result<Adapter> {
    let name = lora.served_name();
    let adapter = model.load_adapter(&lora.path, &name, lora.scale)?;
    log::info!(
        "adapter {name} ({}): {} matrices, rank {}, {:.1} MiB",
        lora.path.display(),
        adapter.matrices(),
        adapter.rank(),
        adapter.bytes() as f64 / (1 << 20) as f64
    );
    Ok(adapter)
}
