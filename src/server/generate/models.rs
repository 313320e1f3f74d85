//! The models one server holds: each loaded with its tokenizer, chat template and grammars,
//! run by an engine of its own over its share of the KV memory (`kv::shares`), the engines
//! taking turns on the CPU (`engine::turns`).

use super::adapters::AdapterSet;
use super::files::{self, FileStamp};
use crate::backend::adapter::{Adapter, ADAPTERS_NEED_CPU};
use crate::config::{ModelSection, PrefixCacheSection};
use crate::engine::turns::{StepTurns, TurnSeat};
use crate::engine::{Engine, EngineConfig, EngineHandle};
use crate::grammar::Grammars;
use crate::kv::shares::{self, ShareRequest};
use crate::model::Model;
use crate::tokenizer::{ChatTemplate, Tokenizer};
use crate::vision::{ImageSources, Projector};
use anyhow::Context;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// What a served model answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Generate,
    Embed,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Generate => "generate",
            Kind::Embed => "embed",
        }
    }
}

/// One model, loaded, with its engine running.
pub struct Ready {
    pub engine: EngineHandle,
    pub tokenizer: Tokenizer,
    pub chat: Option<ChatTemplate>,
    /// Compiles response formats, grammars and tool-call grammars over the vocabulary.
    pub grammars: Grammars,
    /// The id requests select it by (`ModelSection::served_id`).
    pub model_name: String,
    /// The model file's modification time (seconds since the epoch): `created` in the API.
    pub model_created: u64,
    pub kind: Kind,
    /// Its projector, through which it reads images (`ModelSection::mmproj`).
    pub projector: Option<Arc<Projector>>,
    /// Where its images are encoded: in slices that take turns with the engine's steps,
    /// paced against its streams as its prefill is (present with a projector).
    pub encoder: Option<PacedEncoder>,
    /// Its LoRA adapters (`ModelSection::lora`, and those loaded since), each selected by
    /// its name.
    pub adapters: AdapterSet,
}

impl Ready {
    /// Its adapter called `name`.
    pub fn adapter(&self, name: &str) -> Option<Arc<Adapter>> {
        self.adapters.get(name)
    }
}

/// An image encoder's place among the engine's turns, and how much a slice may slow a step.
pub struct PacedEncoder {
    pub seat: TurnSeat,
    pub slowdown: f64,
}

/// Every model the server holds, the first one first.
pub struct Models {
    pub list: Vec<Ready>,
    /// Where requests' images may come from besides `data:` URLs (the profile's `[images]`).
    pub images: ImageSources,
    /// Held while adapters are loaded or unloaded at run time, so that two loads cannot take
    /// one name.
    pub changing_adapters: Mutex<()>,
    /// What they were loaded from: the profile's sections and their files as they were then
    /// (what a reload compares).
    pub specs: Vec<ModelSection>,
    pub stamps: Vec<Option<FileStamp>>,
}

impl Models {
    /// The first model (what the status line and single-model views show).
    pub fn first(&self) -> &Ready {
        &self.list[0]
    }

    /// Loads `models`, divides the KV memory of `engine` among them and starts their
    /// engines; returns their threads.
    pub fn load(
        models: &[ModelSection],
        engine: &EngineConfig,
        images: ImageSources,
        prefix_cache: &PrefixCacheSection,
    ) -> anyhow::Result<(Models, Vec<JoinHandle<()>>)> {
        let several = models.len() > 1;
        if several && engine.backend == crate::backend::select::Backend::Cuda {
            anyhow::bail!(
                "the CUDA backend serves one model per process: serve the others with \
                 --backend cpu or from another process"
            );
        }
        let stamps = files::stamps(models);
        let adapters = models.iter().any(|m| !m.lora.is_empty());
        if adapters && engine.backend == crate::backend::select::Backend::Cuda {
            anyhow::bail!("{ADAPTERS_NEED_CPU}");
        }
        let loaded: Vec<Loaded> = models
            .iter()
            .map(Loaded::open)
            .collect::<anyhow::Result<_>>()?;
        let budgets = match several {
            false => vec![engine.kv_memory_bytes],
            true => shares::divide(
                engine.kv_memory_bytes,
                &loaded
                    .iter()
                    .map(|l| l.share_request(engine))
                    .collect::<Vec<_>>(),
            )?,
        };
        // Engines of several models take turns, and so do an engine and its images' encoder.
        let encoders = loaded.iter().any(|l| l.projector.is_some());
        let turns = (several || encoders).then(|| Arc::new(StepTurns::default()));
        let mut list = Vec::new();
        let mut threads = Vec::new();
        for (l, kv_memory_bytes) in loaded.into_iter().zip(budgets) {
            let share = EngineConfig {
                kv_memory_bytes,
                turns: turns.clone(),
                disk_cache: prefix_cache.for_model(&l.spec.served_id()),
                ..engine.clone()
            };
            let (ready, thread) = l.start(share)?;
            list.push(ready);
            threads.push(thread);
        }
        let models = Models {
            list,
            images,
            changing_adapters: Mutex::new(()),
            specs: models.to_vec(),
            stamps,
        };
        Ok((models, threads))
    }
}

/// A model opened, its engine not yet started.
struct Loaded {
    spec: ModelSection,
    model: Arc<Model>,
    tokenizer: Tokenizer,
    kind: Kind,
    projector: Option<Arc<Projector>>,
    adapters: AdapterSet,
}

impl Loaded {
    fn open(spec: &ModelSection) -> anyhow::Result<Loaded> {
        let model = Arc::new(Model::load(&spec.path)?);
        let tokenizer = Tokenizer::from_gguf(&model.file)?;
        let kind = match spec.embeds(model.config.pooling.embeds())? {
            true => Kind::Embed,
            false if !model.generates() => anyhow::bail!(
                "model {}: kind is generate, but it has no output head (it only embeds)",
                spec.served_id()
            ),
            false => Kind::Generate,
        };
        let projector = match &spec.mmproj {
            None => None,
            Some(path) => Some(Arc::new(open_projector(path, &model, &tokenizer, kind)?)),
        };
        let adapters = AdapterSet::open(model.clone(), &spec.lora)?;
        Ok(Loaded {
            spec: spec.clone(),
            model,
            tokenizer,
            kind,
            projector,
            adapters,
        })
    }

    /// What the model asks of the KV pool it shares (`kv::shares`).
    fn share_request(&self, engine: &EngineConfig) -> ShareRequest {
        let geom = self
            .model
            .config
            .page_geometry(engine.kv_type, engine.block_size);
        ShareRequest {
            id: self.spec.served_id(),
            bytes: (self.spec.kv_memory_mib > 0).then_some(self.spec.kv_memory_mib << 20),
            fraction: (self.spec.kv_share > 0.0).then_some(self.spec.kv_share),
            embeds: self.kind == Kind::Embed,
            token_bytes: geom.block_bytes().div_ceil(engine.block_size.max(1)),
        }
    }

    /// Starts the model's engine over `engine` (its share of the pool).
    fn start(self, engine: EngineConfig) -> anyhow::Result<(Ready, JoinHandle<()>)> {
        let Loaded {
            spec,
            model,
            tokenizer,
            kind,
            projector,
            adapters,
        } = self;
        let chat = match &spec.chat_template_file {
            Some(path) => Some(chat_template_file(&tokenizer, path)?),
            None => chat_template(&tokenizer, &spec.served_id()),
        };
        let model_created = std::fs::metadata(&spec.path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_secs());
        let grammars = Grammars::new(&tokenizer)?;
        if let Some(p) = &projector {
            p.follow_backend(engine.backend);
        }
        let encoder = match (&projector, &engine.turns) {
            (Some(_), Some(turns)) => Some(PacedEncoder {
                seat: turns.seat(),
                slowdown: engine.prefill_pacing,
            }),
            _ => None,
        };
        let (engine, thread) = Engine::start(model, tokenizer.eog_tokens().to_vec(), engine)?;
        let ready = Ready {
            engine,
            tokenizer,
            chat,
            grammars,
            model_name: spec.served_id(),
            model_created,
            kind,
            projector,
            encoder,
            adapters,
        };
        Ok((ready, thread))
    }
}

/// The projector file `path`, checked against the model that reads its rows.
fn open_projector(
    path: &std::path::Path,
    model: &Model,
    tokenizer: &Tokenizer,
    kind: Kind,
) -> anyhow::Result<Projector> {
    if kind != Kind::Generate {
        anyhow::bail!(
            "{}: a projector serves a model that generates",
            path.display()
        );
    }
    let projector = Projector::open_beside(path, &model.config, tokenizer)?;
    log::info!(
        "projector {}: {}, at most {} positions an image",
        path.display(),
        projector.config.kind.name(),
        projector.max_rows_per_image()
    );
    Ok(projector)
}

/// The chat template in `path`, which must compile (it was asked for by name).
fn chat_template_file(
    tokenizer: &Tokenizer,
    path: &std::path::Path,
) -> anyhow::Result<ChatTemplate> {
    let src = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the chat template {}", path.display()))?;
    tokenizer
        .compile_chat_template(&src)
        .map_err(|e| anyhow::anyhow!("chat template {}: {e}", path.display()))
}

/// The model's chat template, compiled; `None` (chat disabled, with a warning) when it has
/// none or it does not compile.
fn chat_template(tokenizer: &Tokenizer, id: &str) -> Option<ChatTemplate> {
    let src = tokenizer.chat_template()?;
    match tokenizer.compile_chat_template(src) {
        Ok(t) => Some(t),
        Err(e) => {
            log::warn!(
                "model {id}: its chat template does not compile ({e}); /v1/chat/completions \
                 is disabled for it"
            );
            None
        }
    }
}
