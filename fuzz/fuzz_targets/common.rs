//! The reference model's tokenizer, chat template and grammar compiler, built once per fuzzing process.
//! Model path: `$EDGELM_FUZZ_MODEL`, else `../models/SmolLM2-135M-Instruct.Q4_1.gguf`
//! relative to the fuzz crate.

#![allow(dead_code)]

use edgelm::gguf::GgufFile;
use edgelm::grammar::Grammars;
use edgelm::tokenizer::{ChatTemplate, Tokenizer};
use std::sync::OnceLock;

pub struct Reference {
    pub tokenizer: Tokenizer,
    pub chat: ChatTemplate,
    pub grammars: Grammars,
}

pub fn reference() -> &'static Reference {
    static REF: OnceLock<Reference> = OnceLock::new();
    REF.get_or_init(|| {
        let path = std::env::var_os("EDGELM_FUZZ_MODEL")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| {
                concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/../models/SmolLM2-135M-Instruct.Q4_1.gguf"
                )
                .into()
            });
        let file = GgufFile::open(&path).unwrap_or_else(|e| {
            panic!(
                "cannot open the reference model {} (set EDGELM_FUZZ_MODEL): {e}",
                path.display()
            )
        });
        let tokenizer = Tokenizer::from_gguf(&file).expect("reference tokenizer");
        let chat = ChatTemplate::new(
            tokenizer.chat_template().expect("reference chat template"),
            tokenizer.special_text(tokenizer.bos),
            tokenizer.special_text(tokenizer.eos),
        )
        .expect("reference chat template compiles");
        let grammars = Grammars::new(&tokenizer).expect("grammar vocabulary");
        Reference {
            tokenizer,
            chat,
            grammars,
        }
    })
}
