//! Loading a damaged model end to end (GGUF parse → config → weights → tokenizer) must give
//! an error or a model, never a panic. The GGUF parser has its own, larger mutation suite
//! (src/gguf/hostile_tests.rs); this one covers everything built on top of it.

mod common;

use common::model_path;
use edgelm::gguf::GgufFile;
use edgelm::model::Model;
use edgelm::tokenizer::Tokenizer;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

fn load(bytes: Vec<u8>) -> Result<(), String> {
    let file = Arc::new(GgufFile::from_bytes(bytes).map_err(|e| e.to_string())?);
    let model = Model::from_file(file.clone()).map_err(|e| e.to_string())?;
    let tok = Tokenizer::from_gguf(&file).map_err(|e| e.to_string())?;
    // A model that loads must also tokenize and stay within its own vocabulary.
    let ids = tok
        .encode("Hello, world!", true)
        .map_err(|e| e.to_string())?;
    assert!(ids.iter().all(|&i| (i as usize) < model.config.vocab_size));
    Ok(())
}

#[test]
fn damaged_real_model_loads_or_fails_cleanly() {
    let original = std::fs::read(model_path()).unwrap();
    // The metadata and tensor table live in the first ~1.8 MB; mutate there.
    let header_len = 1_785_664.min(original.len());
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let (mut loaded, mut failed, mut panics) = (0, 0, Vec::new());
    for variant in 0..240 {
        let mut bytes = original.clone();
        let what = match variant % 4 {
            0 => {
                let at = (next() as usize) % header_len;
                bytes[at] ^= 1 << (next() % 8);
                format!("bit flip at {at}")
            }
            1 => {
                let at = (next() as usize) % (header_len - 8);
                bytes[at..at + 8].copy_from_slice(&next().to_le_bytes());
                format!("u64 overwrite at {at}")
            }
            2 => {
                let len = (next() as usize) % original.len();
                bytes.truncate(len);
                format!("truncated to {len}")
            }
            _ => {
                // Zero a run of bytes: counts, lengths and ids become 0.
                let at = (next() as usize) % (header_len - 64);
                bytes[at..at + 64].fill(0);
                format!("zeroed 64 bytes at {at}")
            }
        };
        match catch_unwind(AssertUnwindSafe(|| load(bytes))) {
            Ok(Ok(())) => loaded += 1,
            Ok(Err(_)) => failed += 1,
            Err(_) => panics.push(what),
        }
    }
    eprintln!(
        "{loaded} variants loaded, {failed} failed with an error, {} panicked",
        panics.len()
    );
    assert!(panics.is_empty(), "panics: {panics:?}");
    assert!(
        failed > 60,
        "the mutations should break many loads ({failed} did)"
    );
}
