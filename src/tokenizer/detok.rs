//! Streaming detokenization: token bytes go in, only complete UTF-8 comes out.
//!
//! A multi-byte character can be split across tokens (byte-level BPE and byte-fallback
//! vocabularies both do this), so bytes are held back until they form valid UTF-8.

#[derive(Default, Debug, Clone)]
pub struct StreamDecoder {
    pending: Vec<u8>,
}

impl StreamDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a token's bytes and returns the text that is now complete (possibly empty).
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let valid = match std::str::from_utf8(&self.pending) {
            Ok(_) => self.pending.len(),
            Err(e) => match e.error_len() {
                // An invalid sequence (not just an unfinished one) can never complete:
                // emit it as U+FFFD rather than stalling the stream forever.
                Some(_) => return self.flush_lossy(),
                None => e.valid_up_to(),
            },
        };
        let rest = self.pending.split_off(valid);
        let done = std::mem::replace(&mut self.pending, rest);
        String::from_utf8(done).expect("prefix checked as valid UTF-8")
    }

    /// Ends the stream: whatever is still held back is emitted, lossily if it is incomplete.
    pub fn finish(&mut self) -> String {
        self.flush_lossy()
    }

    fn flush_lossy(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }

    /// Number of bytes waiting for the rest of a character.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_back_split_characters() {
        let text = "é🚀";
        let bytes = text.as_bytes();
        let mut d = StreamDecoder::new();
        let mut out = String::new();
        for b in bytes {
            let piece = d.push(std::slice::from_ref(b));
            assert!(piece.is_empty() || text.contains(&piece));
            out += &piece;
        }
        out += &d.finish();
        assert_eq!(out, text);
    }

    #[test]
    fn invalid_bytes_do_not_stall() {
        let mut d = StreamDecoder::new();
        assert_eq!(d.push(&[0xff, b'a']), "\u{fffd}a");
        assert_eq!(d.pending_len(), 0);
    }
}
