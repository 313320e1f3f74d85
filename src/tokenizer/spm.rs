//! SentencePiece-style tokenization of one text fragment, as llama.cpp's `llm_tokenizer_spm`
//! does it: start from UTF-8 characters, repeatedly merge the adjacent pair whose joined text
//! is a vocabulary token with the highest score (ties: the leftmost), and spell whatever never
//! became a token as byte tokens (`<0xNN>`).
//!
//! Tokenization must be exactly the peer's, and a Hugging Face BPE built from scores is not
//! (its ranks are per merge rule, so equal scores and alternative splits of one piece order
//! differently); this is the peer's algorithm, small enough to own.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

pub struct Spm {
    /// Token text → id; a text that appears twice maps to its last id, as in llama.cpp.
    ids: HashMap<String, u32>,
    scores: Vec<f32>,
    /// The token for each byte value (`<0xNN>`, or the one-byte text itself as a fallback).
    bytes: Vec<Option<u32>>,
}

#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

struct Bigram {
    left: usize,
    right: usize,
    score: f32,
    len: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    /// The heap's top is the highest score; among equal scores, the leftmost pair.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then(other.left.cmp(&self.left))
    }
}

impl Spm {
    pub fn new(tokens: &[String], scores: &[f32]) -> Spm {
        let mut ids = HashMap::with_capacity(tokens.len());
        for (i, t) in tokens.iter().enumerate() {
            ids.insert(t.clone(), i as u32);
        }
        let bytes = (0..=255u8)
            .map(|b| {
                ids.get(&format!("<0x{b:02X}>")).copied().or_else(|| {
                    std::str::from_utf8(&[b])
                        .ok()
                        .and_then(|s| ids.get(s).copied())
                })
            })
            .collect();
        Spm {
            ids,
            scores: scores.to_vec(),
            bytes,
        }
    }

    /// Appends the tokens of `text` (already whitespace-escaped) to `out`.
    pub fn tokenize(&self, text: &str, out: &mut Vec<u32>) {
        let mut symbols: Vec<Symbol> = Vec::new();
        for (i, (start, c)) in text.char_indices().enumerate() {
            symbols.push(Symbol {
                start,
                len: c.len_utf8(),
                prev: i.checked_sub(1),
                next: None,
            });
            if i > 0 {
                symbols[i - 1].next = Some(i);
            }
        }
        let mut heap = BinaryHeap::new();
        // The last pair that formed each text: how a merged symbol that is not itself a token
        // would be split again (llama.cpp's `rev_merge`).
        let mut rev_merge: HashMap<&str, (usize, usize)> = HashMap::new();
        let mut try_pair =
            |heap: &mut BinaryHeap<Bigram>, syms: &[Symbol], l: Option<usize>, r: Option<usize>| {
                let (Some(l), Some(r)) = (l, r) else { return };
                let (a, b) = (syms[l], syms[r]);
                let joined = &text[a.start..b.start + b.len];
                if let Some(&id) = self.ids.get(joined) {
                    heap.push(Bigram {
                        left: l,
                        right: r,
                        score: self.scores[id as usize],
                        len: joined.len(),
                    });
                    rev_merge.insert(joined, (l, r));
                }
            };
        for i in 1..symbols.len() {
            try_pair(&mut heap, &symbols, Some(i - 1), Some(i));
        }
        while let Some(bg) = heap.pop() {
            let (l, r) = (symbols[bg.left], symbols[bg.right]);
            // Stale: one side was merged away since this pair was queued.
            if l.len == 0 || r.len == 0 || l.len + r.len != bg.len {
                continue;
            }
            symbols[bg.left].len += r.len;
            symbols[bg.right].len = 0;
            symbols[bg.left].next = r.next;
            if let Some(n) = r.next {
                symbols[n].prev = Some(bg.left);
            }
            let left = symbols[bg.left];
            try_pair(&mut heap, &symbols, left.prev, Some(bg.left));
            try_pair(&mut heap, &symbols, Some(bg.left), left.next);
        }
        let mut i = if symbols.is_empty() { None } else { Some(0) };
        while let Some(s) = i {
            self.resegment(text, &symbols, &rev_merge, s, out);
            i = symbols[s].next;
        }
    }

    fn resegment(
        &self,
        text: &str,
        symbols: &[Symbol],
        rev_merge: &HashMap<&str, (usize, usize)>,
        s: usize,
        out: &mut Vec<u32>,
    ) {
        let sym = symbols[s];
        let piece = &text[sym.start..sym.start + sym.len];
        if let Some(&id) = self.ids.get(piece) {
            out.push(id);
            return;
        }
        match rev_merge.get(piece) {
            Some(&(l, r)) => {
                self.resegment(text, symbols, rev_merge, l, out);
                self.resegment(text, symbols, rev_merge, r, out);
            }
            None => out.extend(piece.bytes().filter_map(|b| self.bytes[b as usize])),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab() -> (Vec<String>, Vec<f32>) {
        let mut tokens: Vec<String> = (0..=255u8).map(|b| format!("<0x{b:02X}>")).collect();
        let mut scores = vec![0f32; 256];
        for (t, s) in [
            ("▁", -1.0),
            ("a", -2.0),
            ("b", -2.0),
            ("c", -2.0),
            ("ab", -3.0),
            ("bc", -1.5),
            ("abc", -4.0),
            ("▁a", -0.5),
        ] {
            tokens.push(t.into());
            scores.push(s);
        }
        (tokens, scores)
    }

    fn ids(text: &str) -> Vec<String> {
        let (tokens, scores) = vocab();
        let spm = Spm::new(&tokens, &scores);
        let mut out = Vec::new();
        spm.tokenize(text, &mut out);
        out.iter().map(|&i| tokens[i as usize].clone()).collect()
    }

    #[test]
    fn highest_scoring_pair_merges_first() {
        // "bc" (-1.5) merges before "ab" (-3.0), then "a" + "bc" forms "abc".
        assert_eq!(ids("abc"), vec!["abc"]);
        // "▁a" (-0.5) beats "ab"; "▁a" + "b" is not a token, so it stays split.
        assert_eq!(ids("▁ab"), vec!["▁a", "b"]);
        assert_eq!(ids("cab"), vec!["c", "ab"]);
    }

    #[test]
    fn unknown_characters_become_bytes() {
        assert_eq!(ids("aé"), vec!["a", "<0xC3>", "<0xA9>"]);
        assert!(ids("").is_empty());
    }
}
