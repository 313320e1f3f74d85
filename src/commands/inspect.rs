//! `edgelm inspect`: what a GGUF file holds, and whether edgelm runs it (and if not, why).

use crate::cli::InspectArgs;
use anyhow::{Context, Result};
use edgelm::chat::Syntax;
use edgelm::gguf::{summarize, GgufFile};
use edgelm::model::{Arch, Model};
use edgelm::tokenizer::Tokenizer;
use edgelm::vision::Projector;
use std::sync::Arc;

pub fn run(args: InspectArgs) -> Result<()> {
    super::require_model(&args.model)?;
    let file = GgufFile::open(&args.model)
        .with_context(|| format!("cannot read {}", args.model.display()))?;
    let file = Arc::new(file);
    println!("{}", summarize(&file));
    if file.architecture() == Some("clip") {
        println!("{}", projector_support(&file));
        return Ok(());
    }
    println!("{}", support(&file));
    if let Some(line) = tool_calls(&file) {
        println!("{line}");
    }
    Ok(())
}

/// One line for a model with a chat template: the call syntax its template teaches, which
/// the server parses calls in and forces a required call through (`chat::Syntax`).
fn tool_calls(file: &GgufFile) -> Option<String> {
    let template = file.get_str("tokenizer.chat_template")?;
    let syntax = Syntax::of_template(template);
    Some(format!(
        "tool calls:   {} syntax: {}",
        syntax.name(),
        syntax.example()
    ))
}

/// One line for a projector file (llama.cpp's mmproj): what it is, or why edgelm does not
/// run it.
fn projector_support(file: &Arc<GgufFile>) -> String {
    match Projector::from_file(file.clone()) {
        Ok(p) => format!("supported:    yes ({})", p.describe()),
        Err(e) => format!("supported:    no: {e:#}"),
    }
}

/// One line: how edgelm runs the model, or why it does not.
fn support(file: &Arc<GgufFile>) -> String {
    let model = match Model::from_file(file.clone()) {
        Ok(m) => m,
        Err(e) => return format!("supported:    no: {e:#}"),
    };
    if let Err(e) = Tokenizer::from_gguf(file) {
        return format!("supported:    no: {e:#}");
    }
    let c = &model.config;
    let windows = c.layers.iter().filter(|l| l.window.is_some()).count();
    let convs = c.conv_layers().len();
    let deltas = c.delta_net_layers().len();
    // Convolution and DeltaNet layers have no RoPE to leave out.
    let no_rope = c.layers.iter().filter(|l| l.rope.is_none()).count() - convs - deltas;
    let arch = Arch::named(&c.arch).expect("a model that loads has an architecture in the table");
    let mut notes = vec![arch.describe()];
    if windows > 0 {
        notes.push(format!(
            "{windows} of {} layers with a sliding window ({} KV groups)",
            c.n_layers,
            model.layout.num_groups()
        ));
    }
    if no_rope > 0 {
        notes.push(format!("{no_rope} layers without RoPE"));
    }
    if let Some(taps) = c.short_conv {
        notes.push(format!(
            "{convs} of {} layers short convolutions of {taps} positions, a {} KiB state per sequence",
            c.n_layers,
            c.state_floats() * 4 / 1024
        ));
    }
    if let Some(d) = c.delta_net {
        notes.push(format!(
            "{deltas} of {} layers gated DeltaNets ({} value heads on {} key heads of {}, a \
             convolution of {} positions), a {} KiB state per sequence",
            c.n_layers,
            d.v_heads,
            d.k_heads,
            d.head_dim,
            d.taps,
            c.state_floats() * 4 / 1024
        ));
    }
    if c.mtp_layers > 0 {
        notes.push(format!(
            "{} multi-token-prediction layers not used",
            c.mtp_layers
        ));
    }
    if let Some(moe) = c.moe {
        notes.push(format!(
            "{} experts per layer, {} used per token",
            moe.n_expert, moe.routing.used
        ));
        notes.push(active_parameters(file, &model));
    }
    format!("supported:    yes ({})", notes.join(", "))
}

/// The parameters a token computes with (the file's, less the experts it does not pick) and
/// the weight bytes it reads.
fn active_parameters(file: &GgufFile, model: &Model) -> String {
    let (all, active) = model.parameters();
    let in_file: usize = file.tensors().iter().map(|t| t.n_elements() as usize).sum();
    let active = in_file - (all - active);
    format!(
        "{:.1}M of {:.1}M parameters active per token ({:.1} of {:.1} MiB of weights read)",
        active as f64 / 1e6,
        in_file as f64 / 1e6,
        model.weight_bytes() as f64 / (1 << 20) as f64,
        model.all_weight_bytes() as f64 / (1 << 20) as f64,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgelm::gguf::{Array, GgufWriter, Value};
    use edgelm::model::ARCHITECTURES;

    /// A GGUF of `arch` with a vocabulary and no tensors.
    fn header(arch: &str) -> Arc<GgufFile> {
        let bytes = GgufWriter::new()
            .kv("general.architecture", Value::String(arch.into()))
            .kv(
                "tokenizer.ggml.tokens",
                Value::Array(Array::String(vec!["a".into(); 8])),
            )
            .to_bytes();
        Arc::new(GgufFile::from_bytes(bytes).unwrap())
    }

    /// A file of an architecture edgelm does not run is told every one it does; each one it
    /// runs is named, with what it is, in the line of a file that loads.
    #[test]
    fn inspect_names_every_architecture_the_loader_accepts() {
        let refused = support(&header("no-such-arch"));
        assert!(refused.starts_with("supported:    no:"), "{refused}");
        for arch in ARCHITECTURES {
            assert!(
                refused.contains(&format!(" {},", arch.name))
                    || refused.contains(&format!(" {})", arch.name)),
                "{} is missing from: {refused}",
                arch.name
            );
            let line = arch.describe();
            assert!(line.starts_with(&format!("{}: ", arch.name)), "{line}");
        }
    }

    /// A projector file of a type edgelm does not run is told every type it does.
    #[test]
    fn inspect_names_every_projector_type() {
        let bytes = GgufWriter::new()
            .kv("general.architecture", Value::String("clip".into()))
            .kv("clip.projector_type", Value::String("no-such-type".into()))
            .to_bytes();
        let line = projector_support(&Arc::new(GgufFile::from_bytes(bytes).unwrap()));
        assert!(line.starts_with("supported:    no:"), "{line}");
        for p in edgelm::vision::PROJECTORS {
            assert!(line.contains(p.name), "{} is missing from: {line}", p.name);
        }
    }

    /// Each call syntax is named by inspect for a template that speaks it.
    #[test]
    fn inspect_names_the_tool_call_syntax_of_every_template() {
        for syntax in Syntax::ALL {
            let template = match syntax {
                Syntax::Harmony => "<|channel|>x<|call|>",
                Syntax::Generic => "{{ messages }}",
                other => other.example(),
            };
            let bytes = GgufWriter::new()
                .kv("general.architecture", Value::String("llama".into()))
                .kv("tokenizer.chat_template", Value::String(template.into()))
                .to_bytes();
            let file = GgufFile::from_bytes(bytes).unwrap();
            let line = tool_calls(&file).expect("a template has a call syntax");
            assert!(
                line.starts_with(&format!("tool calls:   {} syntax", syntax.name())),
                "{line}"
            );
        }
    }
}
