//! A LoRA adapter as the forward pass applies it: for each matrix it adapts, a low-rank
//! update added to that matrix's product for the rows of the sequences that use it, so one copy
//! of the base weights serves the base model and every adapter in the same step (the
//! S-LoRA/Punica idea). The update is llama.cpp's (`build_lora_mm`): `W·x + scale · B·(A·x)`,
//! before any bias. `model::adapter` reads one from a GGUF file and checks it against the model.

use super::cpu::gemm::DenseMatrix;
use super::ops::Mat;
use std::collections::HashMap;
use std::fmt;

/// Why a backend refuses adapters: the CUDA backend does not apply their updates, and a
/// model never runs with part of what it was asked for ignored.
pub const ADAPTERS_NEED_CPU: &str =
    "LoRA adapters run on the CPU backend only (the CUDA backend does not apply them)";

/// One matrix's update: `scale · up·(down·x)`.
pub struct LowRank {
    /// A: [rank × the matrix's cols].
    pub down: DenseMatrix,
    /// B's band for the matrix's rows: [rows × rank].
    pub up: DenseMatrix,
    /// `adapter scale · alpha / rank` (the adapter scale alone where alpha is 0), as llama.cpp.
    pub scale: f32,
}

impl LowRank {
    pub fn rank(&self) -> usize {
        self.down.outputs
    }

    fn bytes(&self) -> usize {
        self.down.bytes() + self.up.bytes()
    }
}

/// A loaded adapter: its updates keyed by the base matrix they add to.
pub struct Adapter {
    /// The id requests select it by (`model`).
    pub name: String,
    /// Its identity in the prefix cache (a hash of its tensors and scale): blocks computed
    /// with it are another prompt's than the base model's or another adapter's.
    pub key: u64,
    /// By the base matrix's tensor and first row (a band of a fused tensor is a matrix of its
    /// own, with B's rows for that band).
    updates: HashMap<(usize, usize), LowRank>,
}

impl Adapter {
    pub fn new(name: String, key: u64, updates: Vec<(&Mat, LowRank)>) -> Adapter {
        let updates = updates
            .into_iter()
            .map(|(m, u)| ((m.tensor, m.first_row), u))
            .collect();
        Adapter { name, key, updates }
    }

    /// The update of base matrix `m`, if the adapter has one.
    pub fn update(&self, m: &Mat) -> Option<&LowRank> {
        self.updates.get(&(m.tensor, m.first_row))
    }

    /// Matrices it adapts.
    pub fn matrices(&self) -> usize {
        self.updates.len()
    }

    /// The largest rank of its updates.
    pub fn rank(&self) -> usize {
        self.updates.values().map(LowRank::rank).max().unwrap_or(0)
    }

    /// Memory its updates take.
    pub fn bytes(&self) -> usize {
        self.updates.values().map(LowRank::bytes).sum()
    }
}

impl fmt::Debug for Adapter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Adapter({:?}, {} matrices, rank {})",
            self.name,
            self.matrices(),
            self.rank()
        )
    }
}
