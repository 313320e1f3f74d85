//! `POST /tokenize` and `POST /detokenize`, in vLLM's shapes: a prompt, or messages rendered
//! exactly as a chat request with the same fields renders them (an image as the positions it
//! takes), counted in tokens; and token ids back to text.

use super::error::ApiError;
use super::images::{prompt_with_images, ImageInput};
use super::models::select;
use super::request::{parse, DetokenizeBody, TokenizeBody};
use super::sampling::token_ids;
use crate::chat::{render_prompt, Conversation, Offer};
use crate::server::generate::Models;
use serde_json::{json, Value};

/// `POST /tokenize` on the model the body names.
pub fn tokenize(models: &Models, body: &[u8]) -> Result<Value, ApiError> {
    let req: TokenizeBody = parse(body, |b: &TokenizeBody| &b.extra, &[])?;
    let ready = select(models, req.model.as_deref(), None)?;
    let mut images = Vec::new();
    let text = match (req.prompt, req.messages) {
        (Some(p), None) => p,
        (None, Some(messages)) => {
            let tmpl = ready
                .chat
                .as_ref()
                .ok_or_else(|| ApiError::bad_request("this model has no chat template"))?;
            let conversation = Conversation {
                messages,
                tools: req.tools,
                tool_choice: req.tool_choice,
                parallel_tool_calls: req.parallel_tool_calls,
                reasoning_effort: req.reasoning_effort,
            };
            let offer = Offer::of(&conversation)?;
            let add_generation_prompt = req.add_generation_prompt.unwrap_or(true);
            images = conversation.images();
            render_prompt(tmpl, &conversation, &offer, add_generation_prompt)?
        }
        _ => {
            return Err(ApiError::bad_request(
                "give exactly one of prompt or messages",
            ))
        }
    };
    // Images count as the positions they take (their rows' placeholders among the ids).
    let ids = match images.is_empty() {
        true => ready
            .tokenizer
            .encode(&text, req.add_special_tokens.unwrap_or(true))
            .map_err(|e| ApiError::bad_request(e.to_string()))?,
        false => {
            // Counted whatever the context: /tokenize measures, it does not refuse.
            let input = ImageInput {
                projector: ready.projector.as_deref(),
                sources: &models.images,
                context: usize::MAX,
            };
            prompt_with_images(&ready.tokenizer, &input, &text, &images)?.0
        }
    };
    Ok(json!({"count": ids.len(), "max_model_len": ready.engine.limits.context, "tokens": ids}))
}

/// `POST /detokenize` on the model the body names.
pub fn detokenize(models: &Models, body: &[u8]) -> Result<Value, ApiError> {
    let req: DetokenizeBody = parse(body, |b: &DetokenizeBody| &b.extra, &[])?;
    let ready = select(models, req.model.as_deref(), None)?;
    let ids = token_ids(&req.tokens, ready.tokenizer.vocab_size())?;
    Ok(json!({"prompt": ready.tokenizer.decode(&ids, true)}))
}
