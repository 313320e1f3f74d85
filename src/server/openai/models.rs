//! The models as the API shows them (`GET /v1/models`, `GET /v1/models/{id}`), and which of
//! them a request's `model` names.

use super::error::ApiError;
use crate::backend::adapter::Adapter;
use crate::server::generate::{Kind, Models, Ready};
use serde_json::{json, Value};
use std::sync::Arc;

/// The model a request for `task` (`None`: any) names (`requested`, its `model` field),
/// and the adapter of it the name selects, if any (an adapter runs on its base model's engine).
/// With one model served, any name but an adapter's selects the base model, as clients that
/// send a fixed name expect; an adapter's name after it was unloaded is a 404, never the
/// base model's answer. With several, an unknown name is a 404 `model_not_found`, and no
/// name selects the first model that does `task`. Generation from an embedding model is a 400.
pub fn select_adapted<'a>(
    models: &'a Models,
    requested: Option<&str>,
    task: Option<Kind>,
) -> Result<(&'a Ready, Option<Arc<Adapter>>), ApiError> {
    let adapter_named = |id: &str| {
        let mut all = models.list.iter();
        all.find_map(|m| m.adapter(id).map(|a| (m, Some(a))))
    };
    let unloaded = |id: &str| models.list.iter().any(|m| m.adapters.was_unloaded(id));
    let (chosen, adapter) = match (models.list.as_slice(), requested) {
        (all, Some(id)) => match all.iter().find(|m| m.model_name == id) {
            Some(m) => (m, None),
            None => match (adapter_named(id), all) {
                (Some(found), _) => found,
                (None, [only]) if !unloaded(id) => (only, None),
                (None, _) => return Err(ApiError::model_not_found(id)),
            },
        },
        (all, None) => {
            let first = all.iter().find(|m| task.is_none_or(|t| m.kind == t));
            (first.unwrap_or(&all[0]), None)
        }
    };
    if chosen.kind == Kind::Embed && task == Some(Kind::Generate) {
        let why = format!(
            "model '{}' is an embedding model: it serves /v1/embeddings only",
            chosen.model_name
        );
        return Err(ApiError::bad_request(why).param("model"));
    }
    Ok((chosen, adapter))
}

/// The served model [`select_adapted`] picks (an adapter's name picks its base model).
pub fn select<'a>(
    models: &'a Models,
    requested: Option<&str>,
    task: Option<Kind>,
) -> Result<&'a Ready, ApiError> {
    select_adapted(models, requested, task).map(|(ready, _)| ready)
}

/// `GET /v1/models`: every model served.
pub fn list(models: &Models) -> Value {
    let adapters = models.list.iter().flat_map(|m| {
        m.adapters
            .all()
            .into_iter()
            .map(move |a| adapter_object(m, &a))
    });
    json!({
        "object": "list",
        "data": models.list.iter().map(model_object).chain(adapters).collect::<Vec<_>>(),
    })
}

/// `GET /v1/models/{id}`.
pub fn one(models: &Models, id: &str) -> Result<Value, ApiError> {
    if let Some(m) = models.list.iter().find(|m| m.model_name == id) {
        return Ok(model_object(m));
    }
    let mut all = models.list.iter();
    all.find_map(|m| m.adapter(id).map(|a| adapter_object(m, &a)))
        .ok_or_else(|| ApiError::model_not_found(id))
}

/// A served model as OpenAI describes one: `created` is the model file's modification time;
/// `kind` says which endpoints it answers (generation, or `/v1/embeddings`).
fn model_object(ready: &Ready) -> Value {
    json!({
        "id": ready.model_name, "object": "model", "created": ready.model_created,
        "owned_by": "edgelm", "max_model_len": ready.engine.limits.context,
        "kind": ready.kind.as_str(),
    })
}

/// An adapter as vLLM lists a LoRA module: a model whose `parent` (and `root`) is its base.
pub fn adapter_object(base: &Ready, adapter: &Adapter) -> Value {
    json!({
        "id": adapter.name, "object": "model", "created": base.model_created,
        "owned_by": "edgelm", "max_model_len": base.engine.limits.context,
        "kind": base.kind.as_str(), "parent": base.model_name, "root": base.model_name,
        "lora": { "rank": adapter.rank(), "matrices": adapter.matrices() },
    })
}
