//! Responses kept for `previous_response_id` and `GET`/`DELETE /v1/responses/{id}`: in memory,
//! bounded by count and by bytes (the profile's `response_store_count` and
//! `response_store_mib`); the least recently used go first. A restart forgets them all.

use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

/// One kept response: the object as its client got it, and the conversation's items that
/// led to it (the previous turns' and its own input).
#[derive(Clone)]
pub struct Kept {
    pub response: Value,
    pub input: Vec<Value>,
}

impl Kept {
    /// The conversation to continue from here: its input, then its output items.
    pub fn conversation(&self) -> Vec<Value> {
        let mut items = self.input.clone();
        if let Some(out) = self.response["output"].as_array() {
            items.extend(out.iter().cloned());
        }
        items
    }
}

pub struct Store {
    max_count: usize,
    max_bytes: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<String, Entry>,
    /// Last use → id: the first is the least recently used.
    by_use: BTreeMap<u64, String>,
    bytes: usize,
    clock: u64,
}

struct Entry {
    kept: Kept,
    bytes: usize,
    used: u64,
}

impl Store {
    pub fn new(max_count: usize, max_bytes: usize) -> Store {
        Store {
            max_count,
            max_bytes,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// Keeps a response under its id; the least recently used go until both bounds hold. One
    /// larger than the whole store is not kept.
    pub fn keep(&self, id: &str, kept: Kept) {
        let bytes = kept.response.to_string().len()
            + kept
                .input
                .iter()
                .map(|v| v.to_string().len())
                .sum::<usize>();
        if self.max_count == 0 || bytes > self.max_bytes {
            log::info!(
                "{id}: not kept ({bytes} bytes; the response store holds {} bytes)",
                self.max_bytes
            );
            return;
        }
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.remove(id);
        while inner.entries.len() >= self.max_count || inner.bytes + bytes > self.max_bytes {
            let Some((_, oldest)) = inner.by_use.pop_first() else {
                break;
            };
            inner.remove(&oldest);
        }
        inner.clock += 1;
        let used = inner.clock;
        inner.by_use.insert(used, id.to_string());
        inner.bytes += bytes;
        inner
            .entries
            .insert(id.to_string(), Entry { kept, bytes, used });
    }

    /// The response kept under `id`, now the most recently used.
    pub fn get(&self, id: &str) -> Option<Kept> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.clock += 1;
        let now = inner.clock;
        let entry = inner.entries.get_mut(id)?;
        let was = std::mem::replace(&mut entry.used, now);
        let kept = entry.kept.clone();
        inner.by_use.remove(&was);
        inner.by_use.insert(now, id.to_string());
        Some(kept)
    }

    /// Forgets `id`; whether it was kept.
    pub fn delete(&self, id: &str) -> bool {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id)
    }
}

impl Inner {
    fn remove(&mut self, id: &str) -> bool {
        match self.entries.remove(id) {
            Some(e) => {
                self.by_use.remove(&e.used);
                self.bytes -= e.bytes;
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn kept(text: &str) -> Kept {
        Kept {
            response: json!({"output": [{"type": "message", "content": text}]}),
            input: vec![json!({"role": "user", "content": "q"})],
        }
    }

    #[test]
    fn the_least_recently_used_go_first_when_the_count_is_reached() {
        let s = Store::new(2, 1 << 20);
        s.keep("a", kept("1"));
        s.keep("b", kept("2"));
        assert!(s.get("a").is_some()); // b is now the least recently used
        s.keep("c", kept("3"));
        assert!(s.get("b").is_none());
        assert!(s.get("a").is_some() && s.get("c").is_some());
        assert!(s.delete("a"));
        assert!(!s.delete("a"));
        assert!(s.get("a").is_none());
    }

    #[test]
    fn bytes_bound_the_store_and_an_oversized_response_is_not_kept() {
        let size = {
            let k = kept(&"x".repeat(100));
            k.response.to_string().len() + k.input[0].to_string().len()
        };
        let s = Store::new(100, 2 * size + size / 2);
        for id in ["a", "b", "c"] {
            s.keep(id, kept(&"x".repeat(100)));
        }
        assert!(s.get("a").is_none(), "the bytes allow two");
        assert!(s.get("b").is_some() && s.get("c").is_some());
        s.keep("big", kept(&"x".repeat(10_000)));
        assert!(s.get("big").is_none());
        assert!(s.get("b").is_some(), "an oversized response evicts nothing");
    }

    #[test]
    fn a_conversation_continues_with_the_output() {
        let k = kept("answer");
        let c = k.conversation();
        assert_eq!(c.len(), 2);
        assert_eq!(c[1]["content"], "answer");
    }
}
