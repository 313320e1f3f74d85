use crate::cli::InspectArgs;
use anyhow::{Context, Result};
use edgelm::gguf::{summarize, GgufFile};

pub fn run(args: InspectArgs) -> Result<()> {
    let file = GgufFile::open(&args.model)
        .with_context(|| format!("cannot read {}", args.model.display()))?;
    print!("{}", summarize(&file));
    Ok(())
}
