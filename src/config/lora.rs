//! A LoRA adapter a served model loads at start (`[[model.lora]]`, `serve --lora`), and the
//! one way its flag is written: `[NAME=]PATH[:SCALE]`.

use serde::Deserialize;
use std::path::{Path, PathBuf};

/// One adapter of a model.
#[derive(Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LoraSection {
    /// The id requests select it by (`model`); the file's stem where not given.
    #[serde(default)]
    pub name: String,
    /// The adapter's GGUF (llama.cpp's LoRA format).
    pub path: PathBuf,
    /// Multiplies its updates (llama.cpp's `--lora-scaled`); 1 by default.
    #[serde(default = "one")]
    pub scale: f32,
}

fn one() -> f32 {
    1.0
}

/// The longest adapter name, as a model id is matched against it.
const MAX_NAME: usize = 128;

impl LoraSection {
    /// `[NAME=]PATH[:SCALE]`: a `:SCALE` suffix counts only where it is a number, so a path
    /// holding a colon still reads as a path.
    pub fn parse(arg: &str) -> Result<LoraSection, String> {
        let (name, rest) = match arg.split_once('=') {
            Some((n, rest)) if !n.contains('/') && !Path::new(arg).exists() => (n, rest),
            _ => ("", arg),
        };
        let (path, scale) = match rest.rsplit_once(':') {
            Some((p, s)) if s.parse::<f32>().is_ok() => (p, s.parse().expect("checked")),
            _ => (rest, 1.0),
        };
        let mut section = LoraSection {
            name: name.to_string(),
            path: PathBuf::from(path),
            scale,
        };
        section.name = section.served_name();
        section.check().map(|_| section)
    }

    /// The name requests select it by: `name`, else the file's stem.
    pub fn served_name(&self) -> String {
        if !self.name.is_empty() {
            return self.name.clone();
        }
        self.path
            .file_stem()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// Its own values: a path, a name within bounds, a finite scale.
    pub fn check(&self) -> Result<(), String> {
        if self.path.as_os_str().is_empty() {
            return Err("an adapter needs a path".into());
        }
        let name = self.served_name();
        if name.is_empty() || name.len() > MAX_NAME || name.chars().any(char::is_control) {
            return Err(format!(
                "adapter name {name:?} must be 1 to {MAX_NAME} printable characters"
            ));
        }
        if !self.scale.is_finite() {
            return Err(format!(
                "adapter {name}: scale {} is not a number",
                self.scale
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_read_name_path_and_scale() {
        let l = LoraSection::parse("sql=/opt/a/sql.gguf:0.5").unwrap();
        assert_eq!((l.name.as_str(), l.scale), ("sql", 0.5));
        assert_eq!(l.path, PathBuf::from("/opt/a/sql.gguf"));
        let l = LoraSection::parse("/opt/a/chat.gguf").unwrap();
        assert_eq!((l.name.as_str(), l.scale), ("chat", 1.0));
        // A colon not followed by a number is part of the path.
        let l = LoraSection::parse("x=/tmp/a:b.gguf").unwrap();
        assert_eq!(l.path, PathBuf::from("/tmp/a:b.gguf"));
        assert!(LoraSection::parse("x=:0.5").is_err());
        assert!(LoraSection::parse("x=/a.gguf:inf").is_err());
    }
}
