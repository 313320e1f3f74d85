//! The projector checks: each served model's projector file (`mmproj`) opened strictly beside
//! its model, as `serve` opens it, and one synthetic frame encoded, timed and checked finite.

use super::{Check, Context};
use edgelm::config::ModelSection;
use edgelm::gguf::GgufFile;
use edgelm::model::ModelConfig;
use edgelm::tokenizer::Tokenizer;
use edgelm::vision::{Projector, Rgb};
use std::path::Path;
use std::time::Instant;

/// One check per served model with a projector (the first model's file as `--model` names it).
pub fn projectors(ctx: &Context) -> Vec<Check> {
    let first = (ctx.profile.model.mmproj.as_deref())
        .map(|p| ("projector".to_string(), ctx.model_path.as_path(), p));
    let further = ctx.profile.models.iter().filter_map(|m: &ModelSection| {
        let p = m.mmproj.as_deref()?;
        Some((format!("projector {}", m.served_id()), m.path.as_path(), p))
    });
    first
        .into_iter()
        .chain(further)
        .map(|(name, model, mmproj)| check(name, model, mmproj))
        .collect()
}

fn check(name: String, model: &Path, mmproj: &Path) -> Check {
    let mut c = Check::new(name);
    c.detail("path", mmproj.display().to_string());
    let text = GgufFile::open(model)
        .map_err(anyhow::Error::from)
        .and_then(|f| Ok((ModelConfig::from_gguf(&f)?, Tokenizer::from_gguf(&f)?)));
    let Ok((config, tokenizer)) = text else {
        return c.fail("its model did not load", "fix the model check first");
    };
    let projector =
        match Projector::open_beside(mmproj, &config, &tokenizer) {
            Ok(p) => p,
            Err(e) => return c.fail(
                format!("{e:#}").replace('\n', " "),
                "use the mmproj made for this model; `edgelm inspect MMPROJ` says what a file is",
            ),
        };
    // A small frame of varied pixels: quick, and through the same preprocessing and ViT as a
    // request's image.
    let side = 64;
    let frame = Rgb {
        width: side,
        height: side,
        data: (0..side * side * 3).map(|i| (i * 7 % 251) as u8).collect(),
    };
    let start = Instant::now();
    let rows = projector.encode(&frame);
    let encode_ms = start.elapsed().as_secs_f64() * 1e3;
    c.detail("projector", projector.describe());
    c.detail("positions_per_image", projector.max_rows_per_image());
    c.detail("encode_ms", encode_ms);
    if rows.iter().any(|v| !v.is_finite()) {
        return c.fail(
            "encoding a test frame gave values that are not finite",
            "the projector file is damaged: copy it again",
        );
    }
    c.pass(format!(
        "{}; a {side} × {side} frame encoded in {encode_ms:.0} ms",
        projector.describe()
    ))
}
