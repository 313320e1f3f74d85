use crate::cli::TokenizeArgs;
use anyhow::{Context, Result};
use edgelm::gguf::GgufFile;
use edgelm::tokenizer::Tokenizer;

pub fn run(args: TokenizeArgs) -> Result<()> {
    let path = &args.model.model;
    super::require_model(path)?;
    let file = GgufFile::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let tok = Tokenizer::from_gguf(&file)?;
    let ids = tok.encode(&args.text, args.add_bos)?;
    println!("{}", serde_json::to_string(&ids)?);
    Ok(())
}
