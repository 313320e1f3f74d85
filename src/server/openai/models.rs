//! The models as the API shows them (`GET /v1/models`, `GET /v1/models/{id}`), and which of
//! them a request's `model` names.

use super::error::ApiError;
use crate::server::generate::{Kind, Models, Ready};
use serde_json::{json, Value};

/// The model a request for `task` (`None`: any) names (`requested`, its `model` field).
/// With one model served, any name selects it, as clients that send a fixed name expect.
/// With several, an unknown name is a 404 `model_not_found`, and no name selects the first
/// model that does `task`. Generation from an embedding model is a 400.
pub fn select<'a>(
    models: &'a Models,
    requested: Option<&str>,
    task: Option<Kind>,
) -> Result<&'a Ready, ApiError> {
    let chosen = match (models.list.as_slice(), requested) {
        ([only], _) => only,
        (all, Some(id)) => all
            .iter()
            .find(|m| m.model_name == id)
            .ok_or_else(|| ApiError::model_not_found(id))?,
        (all, None) => all
            .iter()
            .find(|m| task.is_none_or(|t| m.kind == t))
            .unwrap_or(&all[0]),
    };
    if chosen.kind == Kind::Embed && task == Some(Kind::Generate) {
        let why = format!(
            "model '{}' is an embedding model: it serves /v1/embeddings only",
            chosen.model_name
        );
        return Err(ApiError::bad_request(why).param("model"));
    }
    Ok(chosen)
}

/// `GET /v1/models`: every model served.
pub fn list(models: &Models) -> Value {
    json!({
        "object": "list",
        "data": models.list.iter().map(model_object).collect::<Vec<_>>(),
    })
}

/// `GET /v1/models/{id}`.
pub fn one(models: &Models, id: &str) -> Result<Value, ApiError> {
    match models.list.iter().find(|m| m.model_name == id) {
        Some(m) => Ok(model_object(m)),
        None => Err(ApiError::model_not_found(id)),
    }
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
