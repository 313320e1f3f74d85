//! The reference tokenizer (SmolLM2, byte-level BPE with ChatML control tokens).
//!
//! - Any UTF-8 text: `decode(encode(text), render_special = true) == text` minus the
//!   characters the vocabulary cannot spell. There is no normalizer and special-token strings
//!   that the encoder matches whole decode back to their literal text, but SmolLM2's
//!   byte-level vocabulary lacks the byte tokens of six ASCII controls (0x04 0x06 0x13 0x14
//!   0x16 0x1D; the other 15 missing bytes never occur in UTF-8), and BPE without an unknown
//!   token drops them, as Hugging Face `tokenizers` does. The set is computed, not assumed.
//! - The streaming detokenizer, fed token by token, gives the one-shot decode, and both equal
//!   `String::from_utf8_lossy` of the concatenated token bytes (also for arbitrary ids, whose
//!   bytes need not be valid UTF-8, and whatever the split into pushes).
//! - Arbitrary in-range and out-of-range ids decode without panicking.

#![no_main]

#[path = "common.rs"]
mod common;

use edgelm::tokenizer::{StreamDecoder, Tokenizer};
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

/// ASCII characters the tokenizer encodes to nothing (absent byte tokens).
fn unencodable(tok: &Tokenizer) -> &'static [char] {
    static SET: OnceLock<Vec<char>> = OnceLock::new();
    SET.get_or_init(|| {
        (0u8..128)
            .map(char::from)
            .filter(|c| tok.encode(&c.to_string(), false).unwrap().is_empty())
            .collect()
    })
}

fn check_decode(tok: &Tokenizer, ids: &[u32], render_special: bool) -> String {
    let one_shot = tok.decode(ids, render_special);
    let mut all = Vec::new();
    let mut d = StreamDecoder::new();
    let mut streamed = String::new();
    for &id in ids {
        let bytes = tok.token_bytes(id, render_special);
        all.extend_from_slice(bytes);
        streamed += &d.push(bytes);
    }
    streamed += &d.finish();
    assert_eq!(streamed, one_shot, "streaming != one-shot for {ids:?}");
    assert_eq!(
        one_shot,
        String::from_utf8_lossy(&all),
        "decode != lossy bytes for {ids:?}"
    );
    one_shot
}

fuzz_target!(|data: &[u8]| {
    let tok = &common::reference().tokenizer;
    if let Ok(text) = std::str::from_utf8(data) {
        let ids = tok.encode(text, false).expect("encode never fails on text");
        let back = check_decode(tok, &ids, true);
        let skip = unencodable(tok);
        let expected: String = text.chars().filter(|c| !skip.contains(c)).collect();
        assert_eq!(back, expected, "roundtrip failed, ids {ids:?}");
        let with_bos = tok.encode(text, true).expect("encode with BOS");
        assert!(with_bos.len() >= ids.len());
        // Hidden specials: the text minus whatever control tokens it contained.
        check_decode(tok, &ids, false);
    }
    // The bytes as token ids (3 bytes each), mostly in range, some past the vocabulary.
    let vocab = tok.vocab_size() as u32;
    let ids: Vec<u32> = data
        .chunks(3)
        .map(|c| {
            let v = c.iter().fold(0u32, |a, &b| a << 8 | b as u32);
            if v & 0x80_0000 != 0 && c.len() == 3 {
                v // 8M+ : out of range
            } else {
                v % vocab
            }
        })
        .collect();
    check_decode(tok, &ids, true);
    check_decode(tok, &ids, false);
    // An uneven split of the same bytes into pushes must not change the text.
    let mut all = Vec::new();
    for &id in &ids {
        all.extend_from_slice(tok.token_bytes(id, true));
    }
    let mut d = StreamDecoder::new();
    let mut s = String::new();
    let mut rest = &all[..];
    let mut step = 1;
    while !rest.is_empty() {
        let n = step.min(rest.len());
        s += &d.push(&rest[..n]);
        rest = &rest[n..];
        step = step % 5 + 1;
    }
    s += &d.finish();
    assert_eq!(s, String::from_utf8_lossy(&all));
});
