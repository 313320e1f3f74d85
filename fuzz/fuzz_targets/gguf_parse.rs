//! Arbitrary bytes through the GGUF parser, then everything that reads a parsed file:
//! the `inspect` summary, tensor views, the model config + weight checks (`Model::from_file`),
//! and the tokenizer / chat template built from the file's metadata. Errors are fine;
//! panics, hangs and huge allocations are bugs.

#![no_main]

use edgelm::gguf::{summarize, GgufFile};
use edgelm::model::Model;
use edgelm::tokenizer::{ChatTemplate, Tokenizer};
use libfuzzer_sys::fuzz_target;
use std::sync::Arc;

fuzz_target!(|data: &[u8]| {
    let Ok(file) = GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    let _ = summarize(&file);
    for info in file.tensors() {
        let bytes = file.tensor_data(info);
        assert_eq!(bytes.len() as u64, info.size);
        let _ = file.tensor(&info.name);
    }
    if let Ok(tok) = Tokenizer::from_gguf(&file) {
        if let Ok(ids) = tok.encode("Hello, wörld! <|im_start|>", true) {
            let _ = tok.decode(&ids, true);
        }
        let _ = tok.decode(&[0, 1, 2, u32::MAX], false);
        if let Some(src) = tok.chat_template() {
            if let Ok(t) =
                ChatTemplate::new(src, tok.special_text(tok.bos), tok.special_text(tok.eos))
            {
                let _ = t.render(&[], true);
            }
        }
    }
    let _ = Model::from_file(Arc::new(file));
});
