//! Turning one completion's tokens into text as they arrive: UTF-8-safe detokenization and
//! stop strings that never leak (text that could still become a stop string is held back).

use crate::tokenizer::StreamDecoder;

#[derive(Default)]
pub struct ChoiceText {
    decoder: StreamDecoder,
    held: String,
    pub text: String,
    pub stopped: bool,
}

impl ChoiceText {
    /// Adds a token's bytes; returns the text that may now be sent.
    pub fn push(&mut self, bytes: &[u8], stops: &[String]) -> String {
        if self.stopped {
            return String::new();
        }
        let piece = self.decoder.push(bytes);
        self.held.push_str(&piece);
        self.release(stops, false)
    }

    /// The stream ended: release what was held (minus a stop string, if it completes one).
    /// A character whose bytes the end split (a token limit in the middle of it) is dropped
    /// rather than shown as U+FFFD.
    pub fn finish(&mut self, stops: &[String]) -> String {
        if self.stopped {
            return String::new();
        }
        self.decoder.finish_cut();
        self.release(stops, true)
    }

    fn release(&mut self, stops: &[String], end: bool) -> String {
        // A complete stop string: everything before it goes out, the rest never does.
        if let Some(pos) = stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min()
        {
            let out: String = self.held[..pos].to_string();
            self.held.clear();
            self.stopped = true;
            self.text.push_str(&out);
            return out;
        }
        let keep = if end { 0 } else { held_back(&self.held, stops) };
        let cut = self.held.len() - keep;
        let out: String = self.held[..cut].to_string();
        self.held.drain(..cut);
        self.text.push_str(&out);
        out
    }
}

/// Bytes at the end of `s` that are the start of some stop string (on char boundaries).
fn held_back(s: &str, stops: &[String]) -> usize {
    let mut best = 0;
    for (i, _) in s.char_indices() {
        let suffix = &s[i..];
        if stops.iter().any(|st| st.starts_with(suffix)) {
            best = best.max(suffix.len());
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_strings_split_across_tokens_never_leak() {
        let stops = vec!["END".to_string()];
        let mut c = ChoiceText::default();
        let mut out = String::new();
        for piece in ["Hello E", "N", "D and more"] {
            out += &c.push(piece.as_bytes(), &stops);
        }
        assert_eq!(out, "Hello ");
        assert!(c.stopped);
        // A false start is released once it can no longer be a stop string.
        let mut c = ChoiceText::default();
        let mut out = String::new();
        for piece in ["a E", "Nx", "y"] {
            out += &c.push(piece.as_bytes(), &stops);
        }
        out += &c.finish(&stops);
        assert_eq!(out, "a ENxy");
        assert!(!c.stopped);
    }

    #[test]
    fn multibyte_text_is_released_whole() {
        let stops = vec!["é!".to_string()];
        let mut c = ChoiceText::default();
        let b = "café".as_bytes();
        let mut out = c.push(&b[..4], &stops);
        out += &c.push(&b[4..], &stops);
        out += &c.finish(&stops);
        assert_eq!(out, "café");
    }

    #[test]
    fn a_character_split_by_the_end_is_dropped() {
        let mut c = ChoiceText::default();
        let b = "ok 🚀".as_bytes();
        let mut out = c.push(&b[..5], &[]);
        out += &c.finish(&[]);
        assert_eq!(out, "ok ");
        assert_eq!(c.text, "ok ");
        assert!(!c.text.contains(char::REPLACEMENT_CHARACTER));
    }
}
