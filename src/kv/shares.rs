//! How the KV memory one process preallocates is divided among the models it serves. A
//! model may ask for a byte budget or a fraction of the whole; an embedding model that asks
//! for nothing gets room for [`EMBED_POOL_TOKENS`] tokens, at most a quarter of the whole
//! (its inputs hold pages only while they are computed, and wait for room when there is
//! none); the generating models that asked for nothing share what is left
//! equally. Asking for more than there is, or leaving a model with nothing, is an error that
//! names the model.

use anyhow::{bail, Result};

/// Tokens an embedding model's pool holds by default: a few long inputs at once.
pub const EMBED_POOL_TOKENS: usize = 2048;

/// What one model asks of the pool.
#[derive(Clone, Debug, PartialEq)]
pub struct ShareRequest {
    /// The model's id, for the errors.
    pub id: String,
    /// An explicit byte budget.
    pub bytes: Option<usize>,
    /// A fraction of the whole (0 < f ≤ 1).
    pub fraction: Option<f64>,
    /// Serves embeddings only: its default is room for `EMBED_POOL_TOKENS` tokens.
    pub embeds: bool,
    /// KV bytes one token takes in the model's pages (every layer).
    pub token_bytes: usize,
}

/// Bytes of `total` for each model, in the order asked.
pub fn divide(total: usize, asks: &[ShareRequest]) -> Result<Vec<usize>> {
    let mut out: Vec<Option<usize>> = Vec::with_capacity(asks.len());
    for a in asks {
        out.push(match (a.bytes, a.fraction) {
            (Some(_), Some(_)) => {
                bail!("model {}: give a KV byte budget or a share, not both", a.id)
            }
            (Some(b), None) => Some(b),
            (None, Some(f)) if f > 0.0 && f <= 1.0 => Some((total as f64 * f) as usize),
            (None, Some(f)) => bail!(
                "model {}: its KV share must be above 0 and at most 1, got {f}",
                a.id
            ),
            (None, None) if a.embeds => Some(
                a.token_bytes
                    .saturating_mul(EMBED_POOL_TOKENS)
                    .min(total / 4),
            ),
            (None, None) => None,
        });
    }
    let given: usize = out.iter().flatten().sum();
    if given > total {
        bail!(
            "the models' KV budgets ({} MiB) exceed the pool ({} MiB): lower their shares or raise \
             engine.kv_memory_mib",
            given >> 20,
            total >> 20
        );
    }
    let open = out.iter().filter(|b| b.is_none()).count();
    let each = (total - given).checked_div(open).unwrap_or(0);
    let bytes: Vec<usize> = out.into_iter().map(|b| b.unwrap_or(each)).collect();
    if let Some((a, _)) = asks
        .iter()
        .zip(&bytes)
        .find(|(a, &b)| b < a.token_bytes.max(1))
    {
        bail!("model {}: its share of the KV pool holds no token", a.id);
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(id: &str, embeds: bool) -> ShareRequest {
        ShareRequest {
            id: id.into(),
            bytes: None,
            fraction: None,
            embeds,
            token_bytes: 1000,
        }
    }

    #[test]
    fn embedding_models_get_their_default_and_the_rest_is_shared() {
        let total = 100 << 20;
        let asks = [ask("chat", false), ask("embed", true), ask("chat2", false)];
        let b = divide(total, &asks).unwrap();
        assert_eq!(b[1], 1000 * EMBED_POOL_TOKENS);
        assert_eq!(b[0], (total - b[1]) / 2);
        assert_eq!(b[0], b[2]);
        assert!(b.iter().sum::<usize>() <= total);
        // A small pool: the embedding model's default is at most a quarter of it.
        let b = divide(4 << 20, &asks).unwrap();
        assert_eq!(b[1], 1 << 20);
    }

    #[test]
    fn explicit_budgets_and_fractions_come_first() {
        let total = 1000 << 20;
        let mut a = ask("a", false);
        a.fraction = Some(0.25);
        let mut e = ask("e", true);
        e.bytes = Some(10 << 20);
        let b = divide(total, &[a, e, ask("rest", false)]).unwrap();
        assert_eq!(b, vec![250 << 20, 10 << 20, (1000 - 260) << 20]);
    }

    #[test]
    fn impossible_splits_name_the_model() {
        let mut a = ask("big", false);
        a.fraction = Some(0.9);
        let mut b = ask("bigger", false);
        b.fraction = Some(0.5);
        let e = divide(1 << 30, &[a.clone(), b]).unwrap_err().to_string();
        assert!(e.contains("exceed the pool"), "{e}");
        let mut both = ask("both", false);
        both.bytes = Some(1);
        both.fraction = Some(0.1);
        let e = divide(1 << 30, &[both]).unwrap_err().to_string();
        assert!(e.contains("model both"), "{e}");
        let mut zero = ask("zero", false);
        zero.fraction = Some(0.0);
        assert!(divide(1 << 30, &[zero]).is_err());
        // A whole pool given away leaves the others nothing.
        a.fraction = Some(1.0);
        let e = divide(1 << 30, &[a, ask("starved", false)])
            .unwrap_err()
            .to_string();
        assert!(e.contains("model starved"), "{e}");
    }
}
