//! `POST /v1/load_lora_adapter` and `POST /v1/unload_lora_adapter`, in vLLM's shapes: an
//! administrator adds a LoRA adapter to a served model, or takes one away, while it serves.
//! The front lets these through only with the API key (`http::triage`). A loaded adapter is
//! checked against its base as one loaded at start is; an unloaded one finishes the requests
//! already using it and its memory goes with the last of them.

use super::error::ApiError;
use super::models::{adapter_object, select_adapted};
use super::request::{parse, Extra};
use crate::config::LoraSection;
use crate::server::generate::Models;
use serde::Deserialize;
use serde_json::{json, Value};

/// A `/v1/load_lora_adapter` body.
#[derive(Deserialize, Debug)]
pub struct LoadBody {
    /// The id requests will select it by.
    pub lora_name: String,
    /// Its GGUF, on the server's file system.
    pub lora_path: String,
    /// Multiplies its updates (`--lora`'s `:SCALE`); 1 by default.
    pub scale: Option<f32>,
    /// The base model it adapts (the first model where absent).
    pub model: Option<String>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// A `/v1/unload_lora_adapter` body.
#[derive(Deserialize, Debug)]
pub struct UnloadBody {
    pub lora_name: String,
    #[serde(flatten)]
    pub extra: Extra,
}

/// `POST /v1/load_lora_adapter`: the adapter as `/v1/models` lists it.
pub fn load(models: &Models, body: &[u8]) -> Result<Value, ApiError> {
    let req: LoadBody = parse(body, |b: &LoadBody| &b.extra, &[])?;
    let mut lora = LoraSection {
        name: req.lora_name,
        path: req.lora_path.into(),
        scale: req.scale.unwrap_or(1.0),
    };
    lora.name = lora.served_name();
    lora.check()
        .map_err(|why| ApiError::bad_request(why).param("lora_name"))?;
    let base = match select_adapted(models, req.model.as_deref(), None)? {
        (base, None) => base,
        (_, Some(a)) => {
            let why = format!("model '{}' is an adapter: name its base model", a.name);
            return Err(ApiError::bad_request(why).param("model"));
        }
    };
    if let Some(why) = base.engine.limits.adapters_refused {
        return Err(ApiError::bad_request(why));
    }
    // One change at a time, so that the name is still free when the adapter goes in.
    let _changing = models
        .changing_adapters
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let name = &lora.name;
    let taken = models
        .list
        .iter()
        .any(|m| m.model_name == *name || m.adapter(name).is_some());
    if taken {
        let why = format!("the name '{name}' is taken: unload that adapter first, or pick another");
        return Err(ApiError::bad_request(why).param("lora_name"));
    }
    let adapter = base
        .adapters
        .read_file(&lora)
        .map_err(|e| ApiError::bad_request(format!("{e:#}")).param("lora_path"))?;
    base.adapters.insert(adapter.clone());
    log::info!("adapter {name} loaded for {}", base.model_name);
    Ok(adapter_object(base, &adapter))
}

/// `POST /v1/unload_lora_adapter`. vLLM's `lora_int_id` is accepted and ignored: names
/// identify adapters here.
pub fn unload(models: &Models, body: &[u8]) -> Result<Value, ApiError> {
    let req: UnloadBody = parse(body, |b: &UnloadBody| &b.extra, &["lora_int_id"])?;
    let _changing = models
        .changing_adapters
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let name = &req.lora_name;
    let removed = models.list.iter().find_map(|m| m.adapters.remove(name));
    match removed {
        Some(_) => {
            log::info!("adapter {name} unloaded");
            Ok(json!({ "id": name, "object": "model", "deleted": true }))
        }
        None => Err(ApiError::model_not_found(name).param("lora_name")),
    }
}
