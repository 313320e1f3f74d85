//! Running an embeddings request: each input is a prompt the engine prefills and pools
//! (`GenParams::embed`), batched with every other request's prompts.

use super::format::Failure;
use crate::backend::adapter::Adapter;
use crate::engine::{EngineHandle, Event, GenParams, RequestId};
use std::sync::Arc;

/// Submits every input (run with `adapter`, if any) and waits for its vector (in order); on
/// any failure the rest are cancelled.
pub fn embed(
    engine: &EngineHandle,
    inputs: &[Vec<u32>],
    adapter: Option<Arc<Adapter>>,
) -> Result<Vec<Vec<f32>>, Failure> {
    let mut submitted: Vec<(RequestId, _)> = Vec::with_capacity(inputs.len());
    let cancel_all = |ids: &[(RequestId, _)]| ids.iter().for_each(|(id, _)| engine.cancel(*id));
    for p in inputs {
        let params = GenParams {
            max_tokens: Some(0),
            embed: true,
            adapter: adapter.clone(),
            ..GenParams::default()
        };
        match engine.submit(p.clone(), params) {
            Ok(s) => submitted.push(s),
            Err(e) => {
                cancel_all(&submitted);
                return Err(Failure::Refused(e.to_string()));
            }
        }
    }
    let mut vectors = Vec::with_capacity(submitted.len());
    for (i, (_, rx)) in submitted.iter().enumerate() {
        let failed = loop {
            match rx.recv() {
                Ok(Event::Embedding { vector, .. }) => {
                    vectors.push(vector);
                    break None;
                }
                Ok(Event::Error(e)) => break Some(e),
                Ok(_) => continue,
                Err(_) => break Some("the engine stopped".to_string()),
            }
        };
        if let Some(e) = failed {
            cancel_all(&submitted[i..]);
            return Err(Failure::Engine(format!("embedding failed: {e}")));
        }
    }
    Ok(vectors)
}
