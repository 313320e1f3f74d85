//! `edgelm kv-plan`: the numbers an integrator sizes a box with.

use super::model_section;
use crate::cli::KvPlanArgs;
use anyhow::{bail, Context, Result};
use edgelm::config::{LoraSection, ModelSection};
use edgelm::gguf::GgufFile;
use edgelm::kv::plan::KvPlan;
use edgelm::kv::shares::{self, ShareRequest};
use edgelm::model::Model;
use serde_json::json;
use std::sync::Arc;

pub fn run(args: KvPlanArgs) -> Result<()> {
    if args.block_size == 0 || args.ctx == 0 || args.avg_tokens == 0 {
        bail!("--block-size, --ctx and --avg-tokens must be at least 1");
    }
    let memory = args
        .memory_mib
        .checked_mul(1 << 20)
        .context("--memory-mib is too large")?;
    let mut specs: Vec<ModelSection> = args.model.iter().map(|m| model_section(m)).collect();
    attach_projectors(&args.mmproj, &mut specs)?;
    let mut models = Vec::new();
    for spec in &specs {
        super::require_model(&spec.path)?;
        let path = &spec.path;
        let file =
            GgufFile::open(path).with_context(|| format!("cannot read {}", path.display()))?;
        let model = Model::from_file(Arc::new(file))?;
        let embeds = spec.embeds(model.config.pooling.embeds())?;
        models.push((spec, model, embeds));
    }
    // Several models share the pool as `serve` divides it.
    let budgets = match models.len() {
        1 => vec![memory],
        _ => shares::divide(
            memory,
            &models
                .iter()
                .map(|(spec, model, embeds)| {
                    let geom = model.config.page_geometry(args.kv_type, args.block_size);
                    ShareRequest {
                        id: spec.served_id(),
                        bytes: None,
                        fraction: None,
                        embeds: *embeds,
                        token_bytes: geom.block_bytes().div_ceil(args.block_size),
                    }
                })
                .collect::<Vec<_>>(),
        )?,
    };
    let mut plans = Vec::new();
    for (i, ((spec, model, embeds), bytes)) in models.iter().zip(budgets).enumerate() {
        // `--lora` adapts the first model, as `serve --lora` does.
        let lora = if i == 0 { args.lora.as_slice() } else { &[] };
        let (plan, entry) = model_plan(&args, spec, model, *embeds, bytes, lora)?;
        if !args.json {
            if models.len() > 1 {
                let kind = if *embeds { "embeddings" } else { "generation" };
                let id = spec.served_id();
                println!("== {id} ({kind}, {} MiB of the pool)", bytes >> 20);
            }
            print_model_plan(&args, model, &plan, &entry, bytes);
        }
        plans.push(entry);
    }
    if args.json {
        let out = match plans.as_slice() {
            [one]
                if ["images", "adapters", "prefix_cache"]
                    .iter()
                    .all(|k| one[k].is_null()) =>
            {
                one["plan"].clone()
            }
            [one] => {
                let mut out = json!({ "plan": one["plan"], "images": one["images"] });
                for key in ["adapters", "prefix_cache"] {
                    if !one[key].is_null() {
                        out[key] = one[key].clone();
                    }
                }
                out
            }
            _ => json!({ "models": plans }),
        };
        println!("{}", serde_json::to_string_pretty(&out)?);
    }
    Ok(())
}

/// One model's plan over its pool of `memory` bytes, and its entry in the JSON: the plan, its
/// images and its adapters `lora`.
fn model_plan(
    args: &KvPlanArgs,
    spec: &ModelSection,
    model: &Model,
    embeds: bool,
    memory: usize,
    lora: &[LoraSection],
) -> Result<(KvPlan, serde_json::Value)> {
    let plan = plan(args, model, memory)?;
    let images = match &spec.mmproj {
        Some(path) => Some(images(path, model, &plan, args.ctx)?),
        None => None,
    };
    let adapters = match lora {
        [] => None,
        lora => Some(adapters(model, lora)?),
    };
    let prefix_cache = args
        .prefix_cache_dir
        .as_ref()
        .map(|dir| restorable(args, model, dir, &spec.served_id()));
    let entry = json!({
        "id": spec.served_id(),
        "kind": if embeds { "embed" } else { "generate" },
        "memory_bytes": memory,
        "plan": plan,
        "images": images,
        "adapters": adapters,
        "prefix_cache": prefix_cache,
    });
    Ok((plan, entry))
}

/// [`model_plan`] as text.
fn print_model_plan(
    args: &KvPlanArgs,
    model: &Model,
    plan: &KvPlan,
    entry: &serde_json::Value,
    memory: usize,
) {
    print_plan(args, model, plan, memory);
    if !entry["images"].is_null() {
        print_images(&entry["images"]);
    }
    if !entry["adapters"].is_null() {
        print_adapters(&entry["adapters"]);
    }
    let cache = &entry["prefix_cache"];
    if !cache.is_null() {
        println!(
            "prefix cache on disk  {}: {} ({} blocks, {} tokens restored at start)",
            cache["file"].as_str().unwrap_or(""),
            cache["state"].as_str().unwrap_or(""),
            cache["blocks"],
            cache["tokens"]
        );
    }
}

/// What `serve` would restore for the model `id` from the prefix caches in `dir`, with this
/// page format.
fn restorable(
    args: &KvPlanArgs,
    model: &Model,
    dir: &std::path::Path,
    id: &str,
) -> serde_json::Value {
    // The model's cache file as `serve` names it from `[prefix_cache]`.
    let section = edgelm::config::PrefixCacheSection {
        dir: dir.to_path_buf(),
        ..Default::default()
    };
    let config = section.for_model(id).expect("a folder and a budget");
    let geom = model.config.page_geometry(args.kv_type, args.block_size);
    let (file, read) = edgelm::engine::cache_on_disk(&config, &model.file.fingerprint(), &geom);
    use edgelm::kv::persist::NotRead;
    let (state, blocks) = match read {
        Ok(n) => ("restorable", n),
        Err(NotRead::Missing) => ("none", 0),
        Err(NotRead::Mismatch) => (
            "for another model file, KV format or edgelm (deleted at start)",
            0,
        ),
        Err(NotRead::Corrupt(_)) => ("corrupt (discarded at start)", 0),
    };
    json!({
        "file": file, "state": state, "blocks": blocks, "tokens": blocks * args.block_size,
    })
}

/// The memory `model`'s adapters take (read and checked as `serve` reads them): each one's
/// rank, matrices and bytes, and their sum.
fn adapters(model: &Model, lora: &[LoraSection]) -> Result<serde_json::Value> {
    let loaded = super::load_adapters(model, lora)?;
    let each: Vec<_> = loaded
        .iter()
        .map(|a| json!({"name": a.name, "rank": a.rank(), "matrices": a.matrices(), "bytes": a.bytes()}))
        .collect();
    let bytes: usize = loaded.iter().map(|a| a.bytes()).sum();
    Ok(json!({ "each": each, "bytes": bytes }))
}

/// [`adapters`] as text.
fn print_adapters(adapters: &serde_json::Value) {
    let mib = |v: &serde_json::Value| v.as_u64().unwrap_or(0) as f64 / (1 << 20) as f64;
    let each = adapters["each"].as_array().map_or(&[][..], Vec::as_slice);
    let names: Vec<String> = each
        .iter()
        .map(|a| {
            let name = a["name"].as_str().unwrap_or("");
            format!("{name} (rank {}, {:.1} MiB)", a["rank"], mib(&a["bytes"]))
        })
        .collect();
    println!(
        "LoRA adapters         {:.1} MiB beside the pool: {}",
        mib(&adapters["bytes"]),
        names.join(", ")
    );
}

/// Each `--mmproj [ID=]PATH` given to the model it names (the first without an id).
fn attach_projectors(mmproj: &[String], specs: &mut [ModelSection]) -> Result<()> {
    for arg in mmproj {
        let given = model_section(arg);
        let spec = match given.id.as_str() {
            "" => &mut specs[0],
            id => (specs.iter_mut().find(|s| s.served_id() == id))
                .with_context(|| format!("--mmproj {arg}: no --model has the id {id:?}"))?,
        };
        spec.mmproj = Some(given.path);
    }
    Ok(())
}

/// What `model`'s images take with the projector at `path` (opened strictly, as `serve`
/// opens it): the most positions and KV bytes an image takes (a tiled image's largest
/// grid), images a sequence of `ctx` holds at that, and the projector's memory.
fn images(
    path: &std::path::Path,
    model: &Model,
    plan: &KvPlan,
    ctx: usize,
) -> Result<serde_json::Value> {
    let vocab = edgelm::tokenizer::Tokenizer::from_gguf(&model.file)?;
    let projector = edgelm::vision::Projector::open_beside(path, &model.config, &vocab)?;
    let positions = projector.max_rows_per_image();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (weights, encoding) = projector.memory_bytes(threads);
    Ok(json!({
        "projector": projector.describe(),
        "positions_per_image": positions,
        "kv_bytes_per_image": positions * plan.kv_bytes_per_token,
        "images_per_sequence": ctx / positions,
        "weights_bytes": weights,
        "encoding_bytes": encoding,
        "recent_rows_bytes": edgelm::vision::RECENT_IMAGES_BYTES,
    }))
}

/// [`images`] as text.
fn print_images(images: &serde_json::Value) {
    let mib = |key: &str| images[key].as_u64().unwrap_or(0) as f64 / (1 << 20) as f64;
    println!(
        "projector             {}",
        images["projector"].as_str().unwrap_or("")
    );
    println!(
        "images                at most {} positions an image, {:.2} MiB of KV; {} images fit a sequence",
        images["positions_per_image"],
        mib("kv_bytes_per_image"),
        images["images_per_sequence"]
    );
    println!(
        "projector memory      {:.1} MiB of weights, up to {:.1} MiB more to encode an image \
         (kept for the next), {:.0} MiB of recent images' rows",
        mib("weights_bytes"),
        mib("encoding_bytes"),
        mib("recent_rows_bytes")
    );
}

/// The plan for `model` over `memory` bytes of pool.
fn plan(args: &KvPlanArgs, model: &Model, memory: usize) -> Result<KvPlan> {
    let cfg = &model.config;
    if args.kv_type.row_bytes(cfg.head_dim).is_none() {
        bail!(
            "KV type {} needs head_dim to be a multiple of 32 (it is {})",
            args.kv_type,
            cfg.head_dim
        );
    }
    let geom = cfg.page_geometry(args.kv_type, args.block_size);
    let snapshot_budget = args
        .state_snapshot_mib
        .checked_mul(1 << 20)
        .context("--state-snapshot-mib is too large")?;
    Ok(KvPlan::new(
        &geom,
        &cfg.kv_layout(),
        cfg.n_head,
        memory,
        args.ctx,
        args.avg_tokens,
    )
    .with_state(cfg.state_floats() * 4, snapshot_budget))
}

/// The plan as text.
fn print_plan(args: &KvPlanArgs, model: &Model, plan: &KvPlan, memory: usize) {
    let cfg = &model.config;
    let geom = cfg.page_geometry(args.kv_type, args.block_size);
    let layout = cfg.kv_layout();
    println!(
        "model                 {} ({} layers, {} KV heads of {} query heads, head_dim {})",
        cfg.arch, cfg.n_layers, cfg.n_head_kv, cfg.n_head, cfg.head_dim
    );
    if let Some(moe) = cfg.moe {
        let (all, active) = model.parameters();
        println!(
            "experts               {} per layer, {} used per token: {:.1}M of {:.1}M matrix \
             parameters active, {:.1} of {:.1} MiB of weights read per token",
            moe.n_expert,
            moe.routing.used,
            active as f64 / 1e6,
            all as f64 / 1e6,
            model.weight_bytes() as f64 / (1 << 20) as f64,
            model.all_weight_bytes() as f64 / (1 << 20) as f64,
        );
    }
    println!("KV format             {}", plan.kv_type);
    let attending = layout.num_groups() * layout.layers_per_group();
    println!(
        "KV bytes per token    {} (2 x {} layers x {} KV heads x {} B per head row)",
        plan.kv_bytes_per_token,
        attending,
        cfg.n_head_kv,
        geom.row_bytes()
    );
    print_state(cfg, plan);
    println!(
        "block                 {} tokens, {} bytes ({} KV group{} of {} layers{})",
        plan.block_size,
        plan.block_bytes,
        plan.kv_groups,
        if plan.kv_groups == 1 { "" } else { "s" },
        layout.layers_per_group(),
        match plan.windowed_groups {
            0 => String::new(),
            n => format!(", {n} with an attention window"),
        }
    );
    println!(
        "per sequence          {} bytes at {} tokens ({:.2}x of full attention on every layer)",
        plan.kv_bytes_per_sequence,
        plan.ctx,
        plan.kv_bytes_per_sequence as f64 / plan.full_attention_bytes_per_sequence.max(1) as f64
    );
    println!(
        "memory                {} MiB -> {} blocks",
        memory >> 20,
        plan.pool_blocks
    );
    println!("sequences at once     {} paged (avg {} tokens) vs {} contiguous (full {}-token context each): {:.1}x", plan.max_seqs_paged, plan.avg_tokens, plan.max_seqs_contiguous, plan.ctx, plan.max_seqs_paged as f64 / plan.max_seqs_contiguous.max(1) as f64);
    println!(
        "without GQA           {} bytes per token; {} paged, {} contiguous",
        plan.no_gqa_kv_bytes_per_token, plan.no_gqa_max_seqs_paged, plan.no_gqa_max_seqs_contiguous
    );
}

/// A hybrid's recurrent state per sequence (nothing for a model that only attends).
fn print_state(cfg: &edgelm::model::ModelConfig, plan: &KvPlan) {
    if let Some(taps) = cfg.short_conv {
        println!(
            "state per sequence    {} bytes, whatever its length ({} short-convolution layers x \
             {} rows x {} f32), in a slot beside the KV pages; one slot per running sequence",
            plan.state_bytes_per_sequence,
            cfg.conv_layers().len(),
            taps - 1,
            cfg.n_embd
        );
    }
    if let Some(d) = cfg.delta_net {
        println!(
            "state per sequence    {} bytes, whatever its length ({} gated DeltaNet layers x \
             ({} convolution rows of {} channels + {} heads x {}x{}) f32), in a slot beside \
             the KV pages; one slot per running sequence",
            plan.state_bytes_per_sequence,
            cfg.delta_net_layers().len(),
            d.taps - 1,
            d.channels(),
            d.v_heads,
            d.head_dim,
            d.head_dim
        );
    }
    if plan.state_bytes_per_sequence > 0 {
        println!(
            "state snapshots       {} ({} MiB) for the prefix cache: a cached prompt resumes at \
             its last snapshot, taken every {} tokens and at its last full block",
            plan.state_snapshots,
            plan.state_snapshot_bytes >> 20,
            plan.state_snapshot_stride_tokens
        );
    }
}
