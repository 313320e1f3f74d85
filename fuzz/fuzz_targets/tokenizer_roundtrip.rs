//! The reference tokenizer (SmolLM2, byte-level BPE with ChatML control tokens).
//!
//! - Any UTF-8 text: `decode(encode(text), render_special = true)` gives the text back, less
//!   the bytes the vocabulary cannot spell. There is no normalizer, and special-token strings
//!   that the encoder matches whole decode back to their literal text; but SmolLM2's
//!   byte-level vocabulary lacks 21 byte tokens, and BPE without an unknown token drops those
//!   bytes (as Hugging Face `tokenizers` does): six ASCII controls (0x04 0x06 0x13 0x14 0x16
//!   0x1D), the lead bytes 0xF1 0xF2 (only unassigned code points U+40000..U+BFFFF use them;
//!   their continuation bytes then decode as U+FFFD) and 13 bytes UTF-8 never uses. So the
//!   expectation is `from_utf8_lossy(text bytes minus the unspellable ones)`; the set is
//!   computed from the vocabulary, not assumed.
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

/// Bytes no token stands for on its own (the byte-level vocabulary lacks them).
fn unspellable(tok: &Tokenizer) -> &'static [bool; 256] {
    static SET: OnceLock<[bool; 256]> = OnceLock::new();
    SET.get_or_init(|| {
        let mut missing = [true; 256];
        for id in 0..tok.vocab_size() as u32 {
            if let [b] = tok.token_bytes(id, true) {
                if !tok.is_control(id) {
                    missing[*b as usize] = false;
                }
            }
        }
        missing
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
        let skip = unspellable(tok);
        let kept: Vec<u8> = text.bytes().filter(|&b| !skip[b as usize]).collect();
        let expected = String::from_utf8_lossy(&kept);
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
