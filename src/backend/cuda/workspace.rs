//! Every buffer a forward pass needs, allocated once at start-up for the largest step the
//! engine can schedule (`max_batched_tokens`), so no step allocates device memory, and so the
//! addresses a captured decode graph holds stay valid for the executor's life.

use super::mem::DeviceBuf;
use crate::backend::ops::{Buf, ExpertShape, Shape};
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::CudaContext;
use std::sync::Arc;

/// Sizes the workspace is built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps {
    /// Tokens per forward pass.
    pub tokens: usize,
    /// Logit rows computed per output-projection launch (and sampled at once).
    pub logit_rows: usize,
    /// Block-table entries per step, all sequences and KV groups together (the padding table
    /// included).
    pub table_entries: usize,
    /// KV groups (`kv::KvLayout`): each has its own slots and tables.
    pub groups: usize,
    /// A hybrid model's snapshot saves per step (0: the model keeps no recurrent state, and
    /// the metadata has no sequence section).
    pub saves: usize,
}

/// i32 entries per sequence in the metadata's sequence section (kernels/recurrent.cu
/// `SEQ_INTS`), and per snapshot save (`SAVE_INTS`).
pub const SEQ_INTS: usize = 6;
pub const SAVE_INTS: usize = 2;

impl Caps {
    /// `max_tokens` per step, at most `max_seqs` sequences per step, sequences of at most
    /// `context` tokens in blocks of `block_size`, in `groups` KV groups. Decode steps are
    /// padded up to a power of two (a graph bucket), so the token capacity covers `max_seqs`
    /// rounded up too.
    pub fn new(
        max_tokens: usize,
        max_seqs: usize,
        context: usize,
        block_size: usize,
        groups: usize,
    ) -> Caps {
        let bucket_max = max_seqs.max(1).next_power_of_two();
        let tokens = max_tokens.max(bucket_max).max(1);
        let logit_rows = bucket_max.max(64).min(tokens);
        let seqs = max_seqs.max(1).min(tokens);
        let groups = groups.max(1);
        let table_entries = seqs * groups * (context.div_ceil(block_size.max(1)) + 1) + 1;
        Caps {
            tokens,
            logit_rows,
            table_entries,
            groups,
            saves: 0,
        }
    }

    /// The caps of a hybrid model's workspace: its metadata says, per sequence, where its
    /// span lies, its state slot and its snapshot saves (at most one per token: a save is
    /// taken after a distinct number of a span's tokens).
    pub fn with_states(self) -> Caps {
        Caps {
            saves: self.tokens,
            ..self
        }
    }

    /// i32 entries before the tables: tokens, positions and the positions they attend through,
    /// then each group's slots and table offsets, `tokens` entries each; then a hybrid's
    /// sequence section.
    pub fn meta_head_ints(&self, groups: usize) -> usize {
        self.state_offset(groups) + self.state_ints()
    }

    /// Where the sequence section starts: per sequence (a step has at most `tokens`) its
    /// [`SEQ_INTS`], then per save its [`SAVE_INTS`].
    pub fn state_offset(&self, groups: usize) -> usize {
        (3 + 2 * groups) * self.tokens
    }

    fn state_ints(&self) -> usize {
        if self.saves == 0 {
            0
        } else {
            SEQ_INTS * self.tokens + SAVE_INTS * self.saves
        }
    }

    /// i32 entries of the per-step metadata image (see [`Meta`]).
    pub fn meta_ints(&self) -> usize {
        self.meta_head_ints(self.groups) + self.table_entries
    }
}

/// Where each i32 array of a step's metadata lives inside the one `meta` buffer: tokens,
/// positions, the positions they attend through, then per KV group the KV slots and block-table offsets (one per token, at fixed
/// offsets), then a hybrid's sequences and snapshot saves, then the concatenated block tables.
#[derive(Clone, Copy, Debug)]
pub struct Meta {
    pub tokens: CUdeviceptr,
    pub positions: CUdeviceptr,
    /// Per token, the last position it attends to (an image's last, where its positions see
    /// each other; else its own).
    pub through: CUdeviceptr,
    pub tables: CUdeviceptr,
    /// Per sequence, its span, state slot and saves (kernels/recurrent.cu `SEQ_*`).
    pub seqs: CUdeviceptr,
    /// Per snapshot save, its tokens before it and its slot (`SAVE_*`).
    pub saves: CUdeviceptr,
    base: CUdeviceptr,
    tokens_cap: usize,
}

impl Meta {
    /// Group `g`'s KV slot of every token.
    pub fn slots(&self, g: usize) -> CUdeviceptr {
        self.base + (((3 + 2 * g) * self.tokens_cap) * 4) as u64
    }

    /// Where each token's table of group `g` starts within `tables`.
    pub fn table_offsets(&self, g: usize) -> CUdeviceptr {
        self.base + (((4 + 2 * g) * self.tokens_cap) * 4) as u64
    }
}

pub struct Workspace {
    pub caps: Caps,
    /// Residual stream, n x n_embd.
    pub x: DeviceBuf,
    /// Normed input to a matmul, n x n_embd.
    pub h: DeviceBuf,
    pub q: DeviceBuf,
    pub k: DeviceBuf,
    pub v: DeviceBuf,
    pub attn: DeviceBuf,
    /// Output of wo / w_down (n x n_embd).
    pub proj: DeviceBuf,
    /// The rows whose logits are wanted, logit_rows x n_embd.
    pub head: DeviceBuf,
    pub gate: DeviceBuf,
    pub up: DeviceBuf,
    /// q8_1 activations of the widest matmul input.
    pub act: DeviceBuf,
    /// Qwen3.5's buffers (`Buf::Mix`, `Z`, `Beta`, `Alpha`; one byte in other models).
    pub mix: DeviceBuf,
    pub z: DeviceBuf,
    pub beta: DeviceBuf,
    pub alpha: DeviceBuf,
    /// logit_rows x vocab.
    pub logits: DeviceBuf,
    /// Per-token (cos, sin) pairs of each RoPE table: tables x tokens x n_rot/2 pairs.
    pub cs: DeviceBuf,
    /// The i32 metadata image ([`Meta`]).
    pub meta_buf: DeviceBuf,
    /// logit_rows SampleRows (32 bytes each).
    pub sample_params: DeviceBuf,
    /// logit_rows sampled token ids.
    pub sampled: DeviceBuf,
    /// A mixture-of-experts model's routing and expert buffers.
    pub moe: Option<MoeBufs>,
    /// The rows a step gives in place of embeddings (an image's): made by the first step
    /// that has some, grown to the most a step has had.
    pub inputs: Option<InputRows>,
}

/// A step's input rows and the tokens they stand for.
pub struct InputRows {
    /// Rows of the input width (the model's width, and Qwen3-VL's DeepStack rows beside).
    pub rows: DeviceBuf,
    /// i32 token indices, one per row.
    pub tokens: DeviceBuf,
}

/// The buffers of a mixture-of-experts FFN: per token its router logits and picks, per pair
/// (a token and one of its picks, token-major) the expert's gate, up and down rows.
pub struct MoeBufs {
    /// n x experts.
    pub logits: DeviceBuf,
    /// n x used i32 expert ids.
    pub ids: DeviceBuf,
    /// n x used f32 weights.
    pub wts: DeviceBuf,
    /// n · used x ff.
    pub gate: DeviceBuf,
    pub up: DeviceBuf,
    /// n · used x n_embd.
    pub down: DeviceBuf,
}

impl MoeBufs {
    fn new(
        ctx: &Arc<CudaContext>,
        e: ExpertShape,
        tokens: usize,
        embd: usize,
    ) -> Result<Self, String> {
        let f32s = |n: usize| DeviceBuf::zeroed(ctx, n * 4);
        let pairs = tokens * e.used;
        Ok(MoeBufs {
            logits: f32s(tokens * e.count)?,
            ids: f32s(pairs)?,
            wts: f32s(pairs)?,
            gate: f32s(pairs * e.ff)?,
            up: f32s(pairs * e.ff)?,
            down: f32s(pairs * embd)?,
        })
    }

    fn all(&self) -> [&DeviceBuf; 6] {
        [
            &self.logits,
            &self.ids,
            &self.wts,
            &self.gate,
            &self.up,
            &self.down,
        ]
    }
}

impl Workspace {
    pub fn new(ctx: &Arc<CudaContext>, shape: &Shape, caps: Caps) -> Result<Workspace, String> {
        let t = caps.tokens;
        let w = &shape.widths;
        let f32s = |n: usize| DeviceBuf::zeroed(ctx, n * 4);
        let widest = w.embd.max(w.ff).max(w.q).max(w.inner);
        // q8_1 rows: every token's widest input, or every pair's expert FFN row.
        let act_blocks = (t * widest.div_ceil(32))
            .max(shape.experts.map_or(0, |e| t * e.used * e.ff.div_ceil(32)));
        let moe = match shape.experts {
            Some(e) => Some(MoeBufs::new(ctx, e, t, w.embd)?),
            None => None,
        };
        Ok(Workspace {
            caps,
            x: f32s(t * w.embd)?,
            h: f32s(t * w.embd)?,
            q: f32s(t * w.q)?,
            k: f32s(t * w.kv)?,
            v: f32s(t * w.kv)?,
            attn: f32s(t * w.q)?,
            proj: f32s(t * w.embd)?,
            head: f32s(caps.logit_rows * w.embd)?,
            gate: f32s(t * w.ff)?,
            up: f32s(t * w.ff)?,
            act: DeviceBuf::zeroed(ctx, act_blocks * 36)?,
            mix: f32s(t * w.mix)?,
            z: f32s(t * w.inner)?,
            beta: f32s(t * w.dt_heads)?,
            alpha: f32s(t * w.dt_heads)?,
            logits: f32s(caps.logit_rows * w.vocab)?,
            cs: f32s(shape.ropes.len().max(1) * t * shape.n_rot.max(2))?,
            meta_buf: DeviceBuf::zeroed(ctx, caps.meta_ints() * 4)?,
            sample_params: DeviceBuf::zeroed(ctx, caps.logit_rows * 32)?,
            sampled: DeviceBuf::zeroed(ctx, caps.logit_rows * 4)?,
            moe,
            inputs: None,
        })
    }

    pub fn meta(&self) -> Meta {
        let base = self.meta_buf.ptr();
        let t = self.caps.tokens;
        let seqs = self.caps.state_offset(self.caps.groups);
        Meta {
            tokens: base,
            positions: base + (t * 4) as u64,
            through: base + (2 * t * 4) as u64,
            tables: base + (self.caps.meta_head_ints(self.caps.groups) * 4) as u64,
            seqs: base + (seqs * 4) as u64,
            saves: base + ((seqs + SEQ_INTS * t) * 4) as u64,
            base,
            tokens_cap: t,
        }
    }

    /// The device buffer behind `buf`.
    pub fn ptr(&self, buf: Buf) -> CUdeviceptr {
        match buf {
            Buf::X => self.x.ptr(),
            Buf::H => self.h.ptr(),
            Buf::Q => self.q.ptr(),
            Buf::K => self.k.ptr(),
            Buf::V => self.v.ptr(),
            Buf::Attn => self.attn.ptr(),
            Buf::Proj => self.proj.ptr(),
            Buf::Gate => self.gate.ptr(),
            Buf::Up => self.up.ptr(),
            Buf::Head => self.head.ptr(),
            Buf::Logits => self.logits.ptr(),
            Buf::Mix => self.mix.ptr(),
            Buf::Z => self.z.ptr(),
            Buf::Beta => self.beta.ptr(),
            Buf::Alpha => self.alpha.ptr(),
        }
    }

    /// Device bytes of the whole workspace.
    pub fn bytes(&self) -> usize {
        [
            &self.x,
            &self.h,
            &self.q,
            &self.k,
            &self.v,
            &self.attn,
            &self.proj,
            &self.head,
            &self.gate,
            &self.up,
            &self.act,
            &self.mix,
            &self.z,
            &self.beta,
            &self.alpha,
            &self.logits,
            &self.cs,
            &self.meta_buf,
            &self.sample_params,
            &self.sampled,
        ]
        .into_iter()
        .chain(self.moe.iter().flat_map(MoeBufs::all))
        .map(|b| b.bytes())
        .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_cover_padded_decode_and_every_table() {
        let c = Caps::new(512, 16, 8192, 16, 1);
        assert_eq!(c.tokens, 512);
        assert_eq!(c.logit_rows, 64);
        assert_eq!(c.table_entries, 16 * 513 + 1);
        // 12 sequences decode as a bucket of 16, beyond a 12-token step budget.
        let c = Caps::new(12, 12, 256, 16, 1);
        assert_eq!(c.tokens, 16);
        assert_eq!(c.logit_rows, 16);
        assert_eq!(c.meta_ints(), 5 * 16 + c.table_entries);
        // Gemma 3's six groups: slots and offsets for each, tables for each.
        let c = Caps::new(12, 12, 256, 16, 6);
        assert_eq!(c.table_entries, 12 * 6 * 17 + 1);
        assert_eq!(c.meta_ints(), 15 * 16 + c.table_entries);
        // A hybrid's sequence section after the groups' arrays, before the tables.
        let c = Caps::new(12, 12, 256, 16, 1).with_states();
        assert_eq!(c.state_offset(1), 5 * 16);
        assert_eq!(c.meta_head_ints(1), 5 * 16 + SEQ_INTS * 16 + SAVE_INTS * 16);
    }
}
