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
    ///
    /// Invalid sequences become U+FFFD exactly as `String::from_utf8_lossy` would replace
    /// them in the whole stream, so the concatenated output never depends on how the bytes
    /// were split into tokens; only an unfinished character at the end is held back.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        let mut start = 0;
        loop {
            match std::str::from_utf8(&self.pending[start..]) {
                Ok(s) => {
                    out.push_str(s);
                    start = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = start + e.valid_up_to();
                    out.push_str(
                        std::str::from_utf8(&self.pending[start..valid])
                            .expect("prefix checked as valid UTF-8"),
                    );
                    match e.error_len() {
                        // An invalid sequence can never complete: replace it, go on.
                        Some(n) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            start = valid + n;
                        }
                        // An unfinished character at the end: wait for its other bytes.
                        None => {
                            start = valid;
                            break;
                        }
                    }
                }
            }
        }
        self.pending.drain(..start);
        out
    }

    /// Ends the stream: whatever is still held back is emitted, lossily if it is incomplete.
    pub fn finish(&mut self) -> String {
        self.flush_lossy()
    }

    /// Ends a stream that was cut off (a token limit, a stop): an unfinished character at
    /// the end is dropped, since its missing bytes were never generated and U+FFFD would put
    /// a character in the text that the model never wrote. Invalid bytes before it were
    /// already replaced by `push`, so nothing else is held.
    pub fn finish_cut(&mut self) {
        self.pending.clear();
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
    fn a_cut_stream_drops_its_unfinished_character() {
        let mut d = StreamDecoder::new();
        let rocket = "🚀".as_bytes();
        assert_eq!(d.push(b"go "), "go ");
        assert_eq!(d.push(&rocket[..2]), "");
        d.finish_cut();
        assert_eq!(d.pending_len(), 0);
        assert_eq!(d.finish(), "");
    }

    #[test]
    fn invalid_bytes_do_not_stall() {
        let mut d = StreamDecoder::new();
        assert_eq!(d.push(&[0xff, b'a']), "\u{fffd}a");
        assert_eq!(d.pending_len(), 0);
    }

    /// The `tokenizer_roundtrip` fuzz target's case (its oracle: stream output == lossy
    /// decoding of all the bytes): an invalid byte followed by the start of a character in
    /// one push flushes only the invalid byte, so the character completed by the next token
    /// comes out as itself, not as two U+FFFD.
    #[test]
    fn invalid_byte_does_not_swallow_the_next_character() {
        let mut d = StreamDecoder::new();
        let mut out = d.push(&[0xff, 0xe2, 0x82]);
        out += &d.push(&[0xac, b'!']);
        out += &d.finish();
        assert_eq!(out, "\u{fffd}€!");
        assert_eq!(
            out,
            String::from_utf8_lossy(&[0xff, 0xe2, 0x82, 0xac, b'!'])
        );
    }

    #[test]
    fn matches_lossy_decoding_for_any_split() {
        let bytes: &[u8] = &[
            b'a', 0xf0, 0x9f, 0x9a, 0xff, 0xc3, 0xa9, 0xe2, 0x28, 0xa1, 0xf0,
        ];
        let want = String::from_utf8_lossy(bytes);
        for cut1 in 0..=bytes.len() {
            for cut2 in cut1..=bytes.len() {
                let mut d = StreamDecoder::new();
                let mut out = d.push(&bytes[..cut1]);
                out += &d.push(&bytes[cut1..cut2]);
                out += &d.push(&bytes[cut2..]);
                out += &d.finish();
                assert_eq!(out, want, "split at {cut1},{cut2}");
            }
        }
    }
}
