//! edgelm: a single-binary LLM inference appliance for edge boxes.
//!
//! Data flows one way: GGUF weights (`gguf`) and quantized math (`quant`) feed the model
//! (`model`), which reads and writes K/V through the paged pool (`kv`) using a compute
//! backend (`backend`); the engine (`engine`) schedules sequences and samples tokens.
//! Imports follow the same order, top to bottom; docs/layers.md lists the layers and
//! scripts/check-layers.py enforces them.

pub mod backend;
pub mod chat;
pub mod config;
pub mod cpu_features;
pub mod engine;
pub mod gguf;
pub mod grammar;
pub mod kv;
pub mod model;
pub mod quant;
pub mod server;
pub mod systemd;
pub mod tokenizer;
pub mod vision;
