//! A projector file's tensors (llama.cpp's `v.*` and `mm.*` names), each bound once and
//! checked against the config's shapes; a tensor nothing takes is refused.

use super::config::VisionConfig;
use super::kinds::ProjectorKind;
use crate::backend::cpu::gemm::DenseMatrix;
use crate::backend::cpu::matmul::matmul;
use crate::backend::cpu::ops::{activate, add_bias, gated};
use crate::backend::cpu::parallel::for_row_chunks;
use crate::backend::ops::{Activation, LayerNorm, Mat, VecRef};
use crate::gguf::GgufFile;
use crate::model::Binder;
use crate::quant::GgmlType;
use anyhow::{bail, Result};
use std::borrow::Cow;

/// One ViT block: pre-norm attention and a pre-norm FFN, every matrix with its bias.
pub struct VitLayer {
    pub ln1: Norm,
    pub qkv: Qkv,
    pub out: Linear,
    pub ln2: Norm,
    pub ffn: Ffn,
    /// Qwen3-VL's DeepStack: the block's rows, each merged square's side by side, normed
    /// (over the merged width) and through an MLP to the text model's width.
    pub deepstack: Option<(LayerNorm, Mlp)>,
}

/// A block's query, key and value projections: three matrices, or one of three times the
/// rows (Qwen3-VL's `attn_qkv`: each row's Q, then K, then V).
pub enum Qkv {
    Separate(Box<[Linear; 3]>), // Q, K, V: [n_embd × n_embd] each
    Fused(Linear),              // [3·n_embd × n_embd]
}

/// A ViT norm: a layer norm (SigLIP, Qwen3-VL) or an RMS norm (Qwen2.5-VL), with its weight.
#[derive(Clone, Copy)]
pub enum Norm {
    Layer(LayerNorm),
    Rms(VecRef),
}

/// A block's FFN: up [n_ff × n_embd] and down [n_embd × n_ff] as an MLP with GELU between,
/// or with a gate SwiGLU (Qwen2.5-VL's: `down(silu(gate(x)) · up(x))`).
pub struct Ffn {
    pub mlp: Mlp,
    pub gate: Option<Linear>,
}

/// Two biased matrices with GELU between (llama.cpp's `build_ffn` with `FFN_GELU`): a ViT
/// block's FFN without a gate, and the Qwen-VL mergers.
pub struct Mlp {
    pub fc1: Linear,
    pub fc2: Linear,
}

/// A matrix and its bias, if it has one. F16, BF16 and F32 matrices (what mmproj files mostly
/// hold) are repacked at load for the tiled dense GEMM; quantized ones stay in the file for
/// the quantized matmul.
pub struct Linear {
    pub mat: Mat,
    /// A matrix of `mat`'s shape added to it (Qwen-VL's second frame's patch kernel).
    pub plus: Option<Mat>,
    pub dense: Option<DenseMatrix>,
    pub bias: Option<VecRef>,
}

/// What turns the ViT's rows into rows of the text model's width.
pub enum Head {
    /// Gemma 3: pooled, RMS-normed by `norm`, projected by `projection`.
    Gemma3 {
        norm: VecRef,
        /// [projection_dim × n_embd], transposed at load (the file stores it the other way
        /// round, as `stored`) into the dense GEMM's panels.
        projection: DenseMatrix,
        // Read by the device encoder, which transposes it itself.
        #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
        stored: Mat,
    },
    /// Idefics3: each pixel-shuffled row (`n_merge`² patches side by side) projected by `fc`
    /// ([projection_dim × n_embd·n_merge²], no bias).
    Idefics3 { fc: Linear },
    /// Qwen-VL: each merged square's rows (normed by the ViT's last norm) side by side,
    /// through an MLP ([4·n_embd × 4·n_embd], then [projection_dim × 4·n_embd]).
    Merger { mlp: Mlp },
}

pub struct VisionWeights {
    /// Each patch's 3 × p × p pixels (channel, row, column) to the ViT's width.
    pub patch: Linear, // [n_embd × 3·p·p]
    /// One learned row per patch position (Qwen2.5-VL has none).
    pub positions: Option<VecRef>, // [n_patches × n_embd]
    pub pre_norm: Option<Norm>,
    pub layers: Vec<VitLayer>,
    pub post_norm: Option<Norm>,
    pub head: Head,
    /// Every vector (norms, biases, positions), dequantized to f32 once.
    pub arena: Vec<f32>,
}

impl VisionWeights {
    /// Bytes the weights take in memory (the head's projection, the ViT's matrices and the
    /// vectors).
    pub fn bytes(&self) -> usize {
        let projection = match &self.head {
            Head::Gemma3 { projection, .. } => projection.bytes(),
            _ => 0,
        };
        let matrices: usize = self.linears().iter().map(|l| l.bytes()).sum();
        matrices + projection + self.arena.len() * 4
    }

    /// Every matrix with its bias: the patch kernel's, the blocks' and the head's (Gemma 3's
    /// projection aside: it has no bias and is stored transposed).
    pub fn linears(&self) -> Vec<&Linear> {
        let mut all = vec![&self.patch];
        for l in &self.layers {
            match &l.qkv {
                Qkv::Separate(qkv) => all.extend(qkv.iter()),
                Qkv::Fused(qkv) => all.push(qkv),
            }
            all.extend([&l.out, &l.ffn.mlp.fc1, &l.ffn.mlp.fc2]);
            all.extend(&l.ffn.gate);
            if let Some((_, mlp)) = &l.deepstack {
                all.extend([&mlp.fc1, &mlp.fc2]);
            }
        }
        match &self.head {
            Head::Gemma3 { .. } => {}
            Head::Idefics3 { fc } => all.push(fc),
            Head::Merger { mlp } => all.extend([&mlp.fc1, &mlp.fc2]),
        }
        all
    }

    pub fn load(file: &GgufFile, cfg: &VisionConfig) -> Result<VisionWeights> {
        let mut b = Binder::new(file);
        let e = cfg.n_embd;
        let p = cfg.patch_size;
        let kernel = [p as u64, p as u64, 3, e as u64];
        let patch = b.flat_mat("v.patch_embd.weight", &kernel, 3 * p * p, e)?;
        // Qwen2.5-VL's patches have no bias and no learned positions (2-D rotary ones only).
        let qwen25 = cfg.kind == ProjectorKind::Qwen25vl;
        let bias = match qwen25 {
            true => None,
            false => Some(b.vector("v.patch_embd.bias", e)?),
        };
        let patch = match cfg.kind.merges_squares() {
            // Qwen-VL's kernel spans two frames; a still image is both, so the two kernels
            // (the converter's split of it) are one summed.
            true => {
                let second = b.flat_mat("v.patch_embd.weight.1", &kernel, 3 * p * p, e)?;
                Linear::summed(file, patch, second, bias)
            }
            false => Linear::new(file, patch, bias),
        };
        let n_patches = cfg.patches_per_side() * cfg.patches_per_side();
        let positions = match qwen25 {
            true => None,
            false => Some(b.vector("v.position_embd.weight", n_patches * e)?),
        };
        let pre_norm = opt_norm(&mut b, cfg, "v.pre_ln")?;
        let layers = (0..cfg.n_layers)
            .map(|i| vit_layer(&mut b, cfg, i))
            .collect::<Result<Vec<_>>>()?;
        let post_norm = opt_norm(&mut b, cfg, "v.post_ln")?;
        if cfg.kind.merges_squares() && post_norm.is_none() {
            bail!(
                "a {} projector has no v.post_ln (its merger's norm)",
                cfg.kind.name()
            );
        }
        let head = match cfg.kind {
            ProjectorKind::Gemma3 => {
                let norm = b.vector("mm.soft_emb_norm.weight", e)?;
                let stored = b.mat("mm.input_projection.weight", cfg.projection_dim, e)?;
                let (ty, rows) = transposed(file, &stored)?;
                let projection =
                    DenseMatrix::pack(ty, &rows, stored.cols, stored.rows).expect("a dense type");
                Head::Gemma3 {
                    norm,
                    projection,
                    stored,
                }
            }
            ProjectorKind::Idefics3 => {
                let shuffled = e * cfg.n_merge * cfg.n_merge;
                let fc = b.mat("mm.model.fc.weight", shuffled, cfg.projection_dim)?;
                Head::Idefics3 {
                    fc: Linear::new(file, fc, None),
                }
            }
            ProjectorKind::Qwen25vl | ProjectorKind::Qwen3vl => Head::Merger {
                mlp: mlp(&mut b, ["mm.0", "mm.2"], cfg)?,
            },
        };
        let arena = b.finish(&format!("projector '{}'", cfg.kind.name()))?;
        Ok(VisionWeights {
            patch,
            positions,
            pre_norm,
            layers,
            post_norm,
            head,
            arena,
        })
    }
}

fn layer_norm(b: &mut Binder<'_>, name: &str, n: usize) -> Result<LayerNorm> {
    Ok(LayerNorm {
        weight: b.vector(&format!("{name}.weight"), n)?,
        bias: b.vector(&format!("{name}.bias"), n)?,
    })
}

/// The ViT's norm `name`: Qwen2.5-VL's are RMS norms (a weight), the others' layer norms.
fn norm(b: &mut Binder<'_>, cfg: &VisionConfig, name: &str) -> Result<Norm> {
    let e = cfg.n_embd;
    Ok(match cfg.kind {
        ProjectorKind::Qwen25vl => Norm::Rms(b.vector(&format!("{name}.weight"), e)?),
        _ => Norm::Layer(layer_norm(b, name, e)?),
    })
}

fn opt_norm(b: &mut Binder<'_>, cfg: &VisionConfig, name: &str) -> Result<Option<Norm>> {
    match b.index(&format!("{name}.weight")) {
        Some(_) => norm(b, cfg, name).map(Some),
        None => {
            b.allowed(&format!("{name}.bias"), false)?;
            Ok(None)
        }
    }
}

impl Linear {
    /// Bytes its matrix takes: the panels where repacked, else the file's rows (mapped).
    pub fn bytes(&self) -> usize {
        match &self.dense {
            Some(d) => d.bytes(),
            None => self.mat.rows * self.mat.row_bytes(),
        }
    }

    fn new(file: &GgufFile, mat: Mat, bias: Option<VecRef>) -> Linear {
        let dense = DenseMatrix::pack(mat.ty, mat.data(file), mat.rows, mat.cols);
        Linear {
            mat,
            plus: None,
            dense,
            bias,
        }
    }

    /// `a + b` (two matrices of one shape), summed in f32 and packed for the dense GEMM.
    fn summed(file: &GgufFile, a: Mat, b: Mat, bias: Option<VecRef>) -> Linear {
        let mut linear = Linear {
            mat: a,
            plus: Some(b),
            dense: None,
            bias,
        };
        let (ty, rows) = linear.rows(file);
        linear.dense = DenseMatrix::pack(ty, &rows, linear.mat.rows, linear.mat.cols);
        linear
    }

    /// The matrix row-major, of its type as the file stores it; a sum of two in F32.
    pub fn rows<'f>(&self, file: &'f GgufFile) -> (GgmlType, Cow<'f, [u8]>) {
        let Some(b) = &self.plus else {
            return (self.mat.ty, Cow::Borrowed(self.mat.data(file)));
        };
        let values = |m: &Mat| {
            let mut out = vec![0.0; m.rows * m.cols];
            crate::quant::dequantize_row(m.ty, m.data(file), &mut out).expect("a checked type");
            out
        };
        let sum = (values(&self.mat).iter().zip(values(b)))
            .flat_map(|(x, y)| (x + y).to_le_bytes())
            .collect();
        (GgmlType::F32, Cow::Owned(sum))
    }

    /// `out = x · matᵀ + bias`, row by row.
    pub fn apply(&self, file: &GgufFile, arena: &[f32], x: &[f32], out: &mut [f32]) {
        let m = &self.mat;
        match &self.dense {
            Some(dense) => dense.matmul(x, out),
            None => matmul(m.data(file), m.ty, m.rows, m.cols, x, out),
        }
        if let Some(bias) = self.bias {
            let bias = bias.of(arena);
            for_row_chunks(out, m.rows, |_, rows| {
                rows.chunks_exact_mut(bias.len())
                    .for_each(|r| add_bias(r, bias))
            });
        }
    }
}

/// A matrix of `rows` rows of `cols` and its bias of `rows`.
fn biased(b: &mut Binder<'_>, name: &str, cols: usize, rows: usize) -> Result<Linear> {
    let mat = b.mat(&format!("{name}.weight"), cols, rows)?;
    let bias = b.vector(&format!("{name}.bias"), rows)?;
    Ok(Linear::new(b.file(), mat, Some(bias)))
}

fn vit_layer(b: &mut Binder<'_>, cfg: &VisionConfig, i: usize) -> Result<VitLayer> {
    let e = cfg.n_embd;
    let name = |k: &str| format!("v.blk.{i}.{k}");
    // Some converters wrote the FFN's up and down the other way round (llama.cpp swaps them
    // back when `ffn_down` is n_embd wide): the shapes tell which is which.
    let swapped = b
        .dims(&name("ffn_down.weight"))
        .is_some_and(|d| d.first() == Some(&(e as u64)) && cfg.n_ff != e);
    let (up_name, down_name) = match swapped {
        true => (name("ffn_down"), name("ffn_up")),
        false => (name("ffn_up"), name("ffn_down")),
    };
    let qkv = match cfg.kind {
        ProjectorKind::Qwen3vl => Qkv::Fused(biased(b, &name("attn_qkv"), e, 3 * e)?),
        _ => Qkv::Separate(Box::new([
            biased(b, &name("attn_q"), e, e)?,
            biased(b, &name("attn_k"), e, e)?,
            biased(b, &name("attn_v"), e, e)?,
        ])),
    };
    let deepstack = match cfg.deepstack.contains(&i) {
        true => {
            let ds = |k: &str| format!("v.deepstack.{i}.{k}");
            let norm = layer_norm(b, &ds("norm"), 4 * e)?;
            Some((norm, mlp(b, [&ds("fc1"), &ds("fc2")], cfg)?))
        }
        false => None,
    };
    let ffn = Ffn {
        mlp: Mlp {
            fc1: biased(b, &up_name, e, cfg.n_ff)?,
            fc2: biased(b, &down_name, cfg.n_ff, e)?,
        },
        gate: match cfg.kind {
            ProjectorKind::Qwen25vl => Some(biased(b, &name("ffn_gate"), e, cfg.n_ff)?),
            _ => None,
        },
    };
    Ok(VitLayer {
        ln1: norm(b, cfg, &name("ln1"))?,
        qkv,
        out: biased(b, &name("attn_out"), e, e)?,
        ln2: norm(b, cfg, &name("ln2"))?,
        ffn,
        deepstack,
    })
}

/// A Qwen-VL merger MLP `names` (its 2 × 2 squares' rows side by side, to the text
/// model's width).
fn mlp(b: &mut Binder<'_>, names: [&str; 2], cfg: &VisionConfig) -> Result<Mlp> {
    let wide = cfg.n_embd * cfg.n_merge * cfg.n_merge;
    Ok(Mlp {
        fc1: biased(b, names[0], wide, wide)?,
        fc2: biased(b, names[1], wide, cfg.projection_dim)?,
    })
}

impl Mlp {
    /// `out = fc2(gelu(fc1(x)))`, row by row (`scratch`: a row of fc1's outputs per row).
    pub fn apply(
        &self,
        file: &GgufFile,
        arena: &[f32],
        x: &[f32],
        scratch: &mut [f32],
        out: &mut [f32],
    ) {
        self.fc1.apply(file, arena, x, scratch);
        for_row_chunks(scratch, self.fc1.mat.rows, |_, rows| {
            activate(Activation::GeluTanh, rows).expect("GELU has an ungated form")
        });
        self.fc2.apply(file, arena, scratch, out);
    }
}

impl Ffn {
    /// `out = ffn(x)`, row by row (`up` and `gate`: a row of `n_ff` per row each; GELU's
    /// FFN leaves `gate` alone).
    pub fn apply(
        &self,
        file: &GgufFile,
        arena: &[f32],
        x: &[f32],
        (up, gate): (&mut [f32], &mut [f32]),
        out: &mut [f32],
    ) {
        let Some(g) = &self.gate else {
            return self.mlp.apply(file, arena, x, up, out);
        };
        let (gate, n_ff) = (&mut gate[..up.len()], g.mat.rows);
        g.apply(file, arena, x, gate);
        self.mlp.fc1.apply(file, arena, x, up);
        let up = &*up;
        for_row_chunks(gate, n_ff, |r0, rows| {
            gated(Activation::Silu, rows, &up[r0 * n_ff..][..rows.len()])
        });
        self.mlp.fc2.apply(file, arena, gate, out);
    }
}

/// A projection the file stores as `stored.rows` rows of `stored.cols` values (ggml multiplies
/// by its transpose), laid out the other way round: `stored.cols` rows of `stored.rows`.
pub fn transposed(file: &GgufFile, stored: &Mat) -> Result<(GgmlType, Vec<u8>)> {
    let width = match stored.ty {
        GgmlType::F16 | GgmlType::BF16 => 2,
        GgmlType::F32 => 4,
        ty => bail!(
            "tensor '{}' is {ty}: edgelm transposes F32, F16 or BF16 projections only",
            stored.name
        ),
    };
    let (rows, cols) = (stored.cols, stored.rows);
    let data = stored.data(file);
    let mut out = vec![0u8; data.len()];
    for c in 0..cols {
        for r in 0..rows {
            let from = (c * rows + r) * width;
            let to = (r * cols + c) * width;
            out[to..to + width].copy_from_slice(&data[from..from + width]);
        }
    }
    Ok((stored.ty, out))
}
