//! The op set on the CPU: one step's activations in vectors, K/V in the paged pool in RAM.

use super::attention::{paged_attention, AttnShape, AttnToken, TILE};
use super::delta_net::DeltaStep;
use super::delta_net::{conv_silu_span, delta_step, gated_rmsnorm, head_ranges, l2_normalize};
use super::lora::add_updates;
use super::matmul::{embed, embed_packed, matmul_fused, WeightRef};
use super::moe::{moe_ffn, ExpertWeights, MoeScratch};
use super::ops::{
    activate, add_bias, add_in_place, gated, hadamard_64, layernorm_in_place, rmsnorm,
    rmsnorm_in_place, rope_apply, token_cos_sin,
};
use super::packed_weights::PackedWeights;
use super::parallel::for_row_chunks;
use super::parallel::SharedSlice;
use super::short_conv::conv_span;
use crate::backend::batch::{BatchMeta, StateSaveAt};
use crate::backend::ops::{
    Activation, Attention, Buf, DeltaNet, DeltaNetShape, Experts, LayerNorm, Mat, Ops, Routing,
    Shape, ShortConv, VecRef,
};
use crate::gguf::GgufFile;
use crate::kv::{KvLayout, KvPages, Part, StateSlots};
use anyhow::Result;

const BUFS: usize = 15;

fn index(b: Buf) -> usize {
    match b {
        Buf::X => 0,
        Buf::H => 1,
        Buf::Q => 2,
        Buf::K => 3,
        Buf::V => 4,
        Buf::Attn => 5,
        Buf::Proj => 6,
        Buf::Gate => 7,
        Buf::Up => 8,
        Buf::Head => 9,
        Buf::Logits => 10,
        Buf::Mix => 11,
        Buf::Z => 12,
        Buf::Beta => 13,
        Buf::Alpha => 14,
    }
}

/// The activation vectors, kept between steps so that a step allocates nothing once they have
/// grown to the largest step (a 262K-entry logits row is 1 MiB).
#[derive(Default)]
pub struct CpuBuffers {
    bufs: [Vec<f32>; BUFS],
    moe: MoeScratch,
    /// The final-normed hidden rows the last step was asked for (`BatchMeta::hidden_for`).
    hidden: Vec<f32>,
}

impl CpuBuffers {
    /// The logits of the last step (rows × vocab).
    pub fn logits(&self) -> &[f32] {
        &self.bufs[index(Buf::Logits)]
    }

    /// Moves the logits out (no copy); give the vector back with [`Self::recycle_logits`].
    pub fn take_logits(&mut self) -> Vec<f32> {
        std::mem::take(&mut self.bufs[index(Buf::Logits)])
    }

    /// Moves the last step's hidden rows out (rows × n_embd; empty if none were asked for).
    pub fn take_hidden(&mut self) -> Vec<f32> {
        std::mem::take(&mut self.hidden)
    }

    pub fn recycle_logits(&mut self, v: Vec<f32>) {
        let slot = &mut self.bufs[index(Buf::Logits)];
        if v.capacity() > slot.capacity() {
            *slot = v;
        }
    }
}

/// What the model's weights are, for the CPU: the mapped file, the vector arena and the
/// packed matrices (which the CPU reads instead of the file's rows).
#[derive(Clone, Copy)]
pub struct CpuWeights<'a> {
    pub file: &'a GgufFile,
    pub arena: &'a [f32],
    pub packed: &'a PackedWeights,
}

/// One step of the forward pass on the CPU.
pub struct CpuStep<'a> {
    w: CpuWeights<'a>,
    kv: &'a mut KvPages,
    layout: &'a KvLayout,
    shape: &'a Shape,
    batch: &'a BatchMeta,
    bufs: &'a mut CpuBuffers,
    /// Rows gathered into Head / Logits.
    gathered: usize,
    /// Per RoPE table, each token's (cos, sin) pairs.
    cs: Vec<Vec<(f32, f32)>>,
    /// Per KV group, each token's view of its block table.
    attn_tokens: Vec<Vec<AttnToken<'a>>>,
    /// Per KV group, each token's KV slot.
    slots: Vec<Vec<usize>>,
}

impl<'a> CpuStep<'a> {
    /// The residual stream (X): rows × n_embd, in the step's token order.
    pub fn residual(&mut self) -> &mut [f32] {
        &mut self.bufs.bufs[index(Buf::X)]
    }

    /// Copies Head (the final-normed rows `Network::run_final_norm` left there) out as the
    /// step's hidden rows, before the LM head overwrites it.
    pub fn keep_hidden(&mut self) {
        let head = &self.bufs.bufs[index(Buf::Head)];
        self.bufs.hidden.clear();
        self.bufs.hidden.extend_from_slice(head);
    }

    /// Prepares a step over `batch` (already validated against the pool and `layout`).
    pub fn new(
        w: CpuWeights<'a>,
        kv: &'a mut KvPages,
        layout: &'a KvLayout,
        shape: &'a Shape,
        batch: &'a BatchMeta,
        bufs: &'a mut CpuBuffers,
    ) -> CpuStep<'a> {
        // No hidden rows from an earlier step may pass for this one's.
        bufs.hidden.clear();
        let n = batch.len();
        let half = shape.n_rot / 2;
        let cs = shape
            .ropes
            .iter()
            .map(|table| {
                let mut cs = vec![(0f32, 0f32); n * half];
                if half > 0 {
                    for (i, c) in cs.chunks_exact_mut(half).enumerate() {
                        token_cos_sin(batch, i, shape, table, c);
                    }
                }
                cs
            })
            .collect();
        let bt = kv.geometry().block_size;
        let attn_tokens = attn_tokens(batch, layout);
        let slots = (0..layout.num_groups())
            .map(|g| (0..n).map(|i| batch.slot(i, g, bt)).collect())
            .collect();
        for b in [
            Buf::X,
            Buf::H,
            Buf::Q,
            Buf::K,
            Buf::V,
            Buf::Attn,
            Buf::Proj,
            Buf::Gate,
            Buf::Up,
            Buf::Mix,
            Buf::Z,
            Buf::Beta,
            Buf::Alpha,
        ] {
            let v = &mut bufs.bufs[index(b)];
            v.clear();
            v.resize(n * shape.widths.of(b), 0.0);
        }
        CpuStep {
            w,
            kv,
            layout,
            shape,
            batch,
            bufs,
            gathered: 0,
            cs,
            attn_tokens,
            slots,
        }
    }

    /// KV group `group`'s tokens as layer attention `a` sees them where that is not the
    /// group's causal view: with bidirectional attention, each one every position of its span
    /// (a query's visible range ends at its span's last position, not its own); with a
    /// symmetric window, only those within half the window of it. `None`: the group's view.
    fn visible(&self, group: usize, a: &Attention) -> Option<Vec<AttnToken<'a>>> {
        if a.causal && a.window.is_none_or(|w| w.trailing().is_some()) {
            return None;
        }
        let spans = self.batch.spans();
        let tokens = self.attn_tokens[group].iter().enumerate().map(|(i, t)| {
            let last = match a.causal {
                true => t.pos,
                false => self.batch.positions[spans[self.batch.seq_of[i]].end - 1],
            };
            let (first, pos) = match a.window {
                Some(w) => w.clamp(t.pos, t.first, last),
                None => (t.first, last),
            };
            AttnToken { pos, first, ..*t }
        });
        Some(tokens.collect())
    }

    fn buf(&mut self, b: Buf) -> &mut Vec<f32> {
        &mut self.bufs.bufs[index(b)]
    }

    /// Takes a buffer out (to use it beside another one); put it back with [`Self::put`].
    fn take(&mut self, b: Buf) -> Vec<f32> {
        std::mem::take(self.buf(b))
    }

    fn put(&mut self, b: Buf, v: Vec<f32>) {
        *self.buf(b) = v;
    }

    /// Where DeltaNet layer `d`'s state lies in a slot: its convolution rows, then its heads'
    /// matrices; checked to fit the pool's slots.
    fn delta_state(&self, d: &DeltaNet) -> Result<std::ops::Range<usize>> {
        let per_layer = d.shape.floats();
        let range = d.index * per_layer..(d.index + 1) * per_layer;
        if range.end > self.kv.states.floats() {
            anyhow::bail!(
                "DeltaNet layer {} needs state values {range:?}, past the slot's {}",
                d.index,
                self.kv.states.floats()
            );
        }
        Ok(range)
    }

    /// `m` as the matmul reads it: its packed groups where it was packed, else the file's rows.
    fn weight(&self, m: &Mat) -> WeightRef<'a> {
        let file = self.w.file;
        let packed = self.w.packed.get(m);
        WeightRef {
            w: packed.unwrap_or_else(|| m.data(file)),
            ty: m.ty,
            rows: m.rows,
            cols: m.cols,
            height: file.tensors()[m.tensor].dims[1] as usize,
            packed: packed.is_some(),
        }
    }
}

impl Ops for CpuStep<'_> {
    fn embed(&mut self, table: &Mat, scale: f32) -> Result<()> {
        let (file, tokens) = (self.w.file, &self.batch.tokens);
        let x = &mut self.bufs.bufs[index(Buf::X)];
        match self.w.packed.get(table) {
            Some(packed) => embed_packed(packed, table.ty, table.cols, tokens, x),
            None => embed(table.data(file), table.ty, table.cols, tokens, x),
        }
        if scale != 1.0 {
            x.iter_mut().for_each(|v| *v *= scale);
        }
        // Rows given in place of embeddings (an image's) go in as they are: the scale is the
        // token embeddings' (Gemma's √n_embd), not theirs. Qwen3-VL's carry their DeepStack
        // rows after the embedding ([`Ops::add_deepstack`]).
        let width = table.cols * (1 + self.shape.deepstack);
        for input in &self.batch.inputs {
            let row = input.rows.row(input.row);
            if row.len() != width {
                anyhow::bail!(
                    "an input row is {} wide, the model's input rows {width}",
                    row.len()
                );
            }
            x[input.token * table.cols..][..table.cols].copy_from_slice(&row[..table.cols]);
        }
        Ok(())
    }

    fn add_deepstack(&mut self, part: usize) -> Result<()> {
        let n = self.shape.widths.embd;
        if part == 0 || part > self.shape.deepstack {
            anyhow::bail!("DeepStack row {part} of {}", self.shape.deepstack);
        }
        let x = &mut self.bufs.bufs[index(Buf::X)];
        for input in &self.batch.inputs {
            let row = &input.rows.row(input.row)[part * n..][..n];
            add_in_place(&mut x[input.token * n..][..n], row);
        }
        Ok(())
    }

    fn rmsnorm(&mut self, src: Buf, w: VecRef, eps: f32, dst: Buf) -> Result<()> {
        let w = w.of(self.w.arena);
        let n = w.len();
        if src == dst {
            for_row_chunks(self.buf(src), n, |_, rows| rmsnorm_in_place(rows, w, eps));
        } else {
            let mut out = self.take(dst);
            let x = &self.bufs.bufs[index(src)];
            for_row_chunks(&mut out, n, |r0, rows| {
                rmsnorm(&x[r0 * n..r0 * n + rows.len()], w, eps, rows)
            });
            self.put(dst, out);
        }
        Ok(())
    }

    fn layernorm(&mut self, buf: Buf, n: LayerNorm, eps: f32) -> Result<()> {
        let (w, b) = (n.weight.of(self.w.arena), n.bias.of(self.w.arena));
        let x = &mut self.bufs.bufs[index(buf)];
        for_row_chunks(x, w.len(), |_, rows| layernorm_in_place(rows, w, b, eps));
        Ok(())
    }

    fn add_positions(&mut self, table: &Mat) -> Result<()> {
        let rows: Vec<u32> = self.batch.positions.iter().map(|&p| p as u32).collect();
        if let Some(&bad) = rows.iter().find(|&&p| p as usize >= table.rows) {
            anyhow::bail!(
                "position {bad} is past the {} position embeddings",
                table.rows
            );
        }
        let mut pos = vec![0f32; rows.len() * table.cols];
        embed(
            table.data(self.w.file),
            table.ty,
            table.cols,
            &rows,
            &mut pos,
        );
        add_in_place(self.buf(Buf::X), &pos);
        Ok(())
    }

    fn activate(&mut self, buf: Buf, act: Activation) -> Result<()> {
        // Refused before any row is touched, so that the rows below cannot fail.
        activate(act, &mut [])?;
        let x = &mut self.bufs.bufs[index(buf)];
        let width = self.shape.widths.of(buf);
        for_row_chunks(x, width, |_, rows| {
            activate(act, rows).expect("checked above");
        });
        Ok(())
    }

    fn matmul(&mut self, x: Buf, outs: &[(&Mat, Buf)]) -> Result<()> {
        let mats: Vec<WeightRef<'_>> = outs.iter().map(|(m, _)| self.weight(m)).collect();
        let rows = self.buf(x).len() / outs[0].0.cols;
        let mut taken: Vec<Vec<f32>> = outs
            .iter()
            .map(|&(m, b)| {
                let mut v = self.take(b);
                // Not cleared: `matmul_fused` writes every value, and zeroing a prompt's
                // outputs first was a serial pass over megabytes per matrix.
                v.resize(rows * m.rows, 0.0);
                v
            })
            .collect();
        {
            let mut refs: Vec<&mut [f32]> = taken.iter_mut().map(|v| &mut v[..]).collect();
            // The head's rows are the gathered ones: their tokens' kinds.
            let batch = self.batch;
            let head_kinds: Vec<bool>;
            let generated: &[bool] = if x == Buf::Head {
                head_kinds = batch
                    .logits_for
                    .iter()
                    .map(|&i| batch.is_generated(i))
                    .collect();
                &head_kinds
            } else {
                &batch.generated
            };
            let input = &self.bufs.bufs[index(x)];
            matmul_fused(&mats, input, &mut refs, generated);
            let mut adapted: Vec<(&Mat, &mut [f32])> =
                outs.iter().map(|&(m, _)| m).zip(refs).collect();
            add_updates(batch, x == Buf::Head, input, &mut adapted);
        }
        for (&(_, b), v) in outs.iter().zip(taken) {
            self.put(b, v);
        }
        Ok(())
    }

    fn add_bias(&mut self, buf: Buf, b: VecRef) -> Result<()> {
        let bias = b.of(self.w.arena);
        add_bias(&mut self.bufs.bufs[index(buf)], bias);
        Ok(())
    }

    fn rope(&mut self, buf: Buf, table: usize) -> Result<()> {
        let s = self.shape;
        let half = s.n_rot / 2;
        let cs = &self.cs[table];
        let x = &mut self.bufs.bufs[index(buf)];
        let width = s.widths.of(buf);
        for_row_chunks(x, width, |r0, rows| {
            for (i, row) in (r0..).zip(rows.chunks_exact_mut(width)) {
                rope_apply(
                    row,
                    s.head_dim,
                    s.n_rot,
                    s.rope_layout,
                    &cs[i * half..(i + 1) * half],
                );
            }
        });
        Ok(())
    }

    fn hadamard(&mut self, buf: Buf) -> Result<()> {
        hadamard_64(self.buf(buf));
        Ok(())
    }

    fn attention(&mut self, a: Attention) -> Result<()> {
        let (group, layer) = self.layout.layer_slot[a.layer];
        let hd = self.shape.head_dim;
        let kvd = self.shape.widths.kv;
        // This step's K/V first: tokens later in a span attend to earlier ones.
        let (k, v) = (
            &self.bufs.bufs[index(Buf::K)],
            &self.bufs.bufs[index(Buf::V)],
        );
        for (i, &slot) in self.slots[group].iter().enumerate() {
            for h in 0..self.shape.n_head_kv {
                let off = i * kvd + h * hd;
                self.kv
                    .write_row(layer, slot, Part::K, h, &k[off..off + hd]);
                self.kv
                    .write_row(layer, slot, Part::V, h, &v[off..off + hd]);
            }
        }
        let shape = AttnShape {
            n_head: self.shape.n_head,
            n_head_kv: self.shape.n_head_kv,
            head_dim: hd,
            scale: a.scale,
        };
        let mut out = self.take(Buf::Attn);
        let visible = self.visible(group, &a);
        paged_attention(
            self.kv,
            layer,
            &shape,
            visible.as_deref().unwrap_or(&self.attn_tokens[group]),
            &self.bufs.bufs[index(Buf::Q)],
            a.sinks.map(|s| s.of(self.w.arena)),
            &mut out,
        );
        self.put(Buf::Attn, out);
        Ok(())
    }

    fn glu(&mut self, act: Activation) -> Result<()> {
        let mut gate = self.take(Buf::Gate);
        let up = &self.bufs.bufs[index(Buf::Up)];
        let ff = self.shape.widths.of(Buf::Gate);
        for_row_chunks(&mut gate, ff, |r0, g| {
            gated(act, g, &up[r0 * ff..r0 * ff + g.len()])
        });
        self.put(Buf::Gate, gate);
        Ok(())
    }

    fn moe(&mut self, experts: &Experts, routing: Routing, act: Activation) -> Result<()> {
        let all = |ms: &[Mat]| ms.iter().map(|m| self.weight(m)).collect();
        let arena = self.w.arena;
        let w = ExpertWeights {
            router: self.weight(&experts.router),
            router_bias: experts.router_bias.map(|b| b.of(arena)),
            gate: all(&experts.gate),
            up: all(&experts.up),
            down: all(&experts.down),
            biases: experts.biases.as_ref().map(|bs| {
                bs.iter()
                    .map(|b| [b.gate.of(arena), b.up.of(arena), b.down.of(arena)])
                    .collect()
            }),
        };
        let mut out = self.take(Buf::Proj);
        let bufs = &mut *self.bufs;
        moe_ffn(
            &w,
            routing,
            act,
            &bufs.bufs[index(Buf::H)],
            &self.batch.generated,
            &mut bufs.moe,
            &mut out,
        );
        self.put(Buf::Proj, out);
        Ok(())
    }

    fn add_scaled(&mut self, dst: Buf, src: Buf, scale: f32) -> Result<()> {
        let mut d = self.take(dst);
        let s = &self.bufs.bufs[index(src)];
        let width = self.shape.widths.of(dst);
        for_row_chunks(&mut d, width, |r0, d| {
            let s = &s[r0 * width..r0 * width + d.len()];
            if scale == 1.0 {
                add_in_place(d, s);
            } else {
                // Scaled first, then added: two roundings, as ggml's scale then add.
                d.iter_mut().zip(s).for_each(|(a, &b)| *a += b * scale);
            }
        });
        self.put(dst, d);
        Ok(())
    }

    fn scale(&mut self, buf: Buf, s: f32) -> Result<()> {
        self.buf(buf).iter_mut().for_each(|v| *v *= s);
        Ok(())
    }

    fn softcap(&mut self, buf: Buf, cap: f32) -> Result<()> {
        self.buf(buf)
            .iter_mut()
            .for_each(|v| *v = (*v * (1.0 / cap)).tanh() * cap);
        Ok(())
    }

    fn split_query_gate(&mut self) -> Result<()> {
        let hd = self.shape.head_dim;
        let mut mix = self.take(Buf::Mix);
        let q = self.buf(Buf::Q);
        q.clear();
        // Per head, the query's values then the gate's: the queries to Q, the gates packed
        // to the front of Mix (a gate moves to a place no later than its own).
        let mut gates = 0;
        for head in 0..mix.len() / (2 * hd) {
            let at = head * 2 * hd;
            q.extend_from_slice(&mix[at..at + hd]);
            mix.copy_within(at + hd..at + 2 * hd, gates);
            gates += hd;
        }
        mix.truncate(gates);
        self.put(Buf::Mix, mix);
        Ok(())
    }

    fn output_gate(&mut self) -> Result<()> {
        let mut attn = self.take(Buf::Attn);
        let gate = &self.bufs.bufs[index(Buf::Mix)];
        if gate.len() != attn.len() {
            anyhow::bail!(
                "the output gate has {} values for {}",
                gate.len(),
                attn.len()
            );
        }
        for (a, &g) in attn.iter_mut().zip(gate) {
            *a *= 1.0 / (1.0 + (-g).exp());
        }
        self.put(Buf::Attn, attn);
        Ok(())
    }

    fn short_conv(&mut self, conv: ShortConv) -> Result<()> {
        let n = self.shape.widths.embd;
        let kernel = conv.kernel.of(self.w.arena);
        let per_layer = (conv.taps - 1) * n;
        let layer = conv.index * per_layer..(conv.index + 1) * per_layer;
        if layer.end > self.kv.states.floats() {
            anyhow::bail!(
                "short convolution {} needs state values {layer:?}, past the slot's {}",
                conv.index,
                self.kv.states.floats()
            );
        }
        let mut c = self.take(Buf::Attn);
        let (b, x) = (
            &self.bufs.bufs[index(Buf::Q)],
            &self.bufs.bufs[index(Buf::Proj)],
        );
        for (seq, span) in self.batch.spans().into_iter().enumerate() {
            let (state, mut saves) = seq_states(self.batch, &mut self.kv.states, seq, &layer)?;
            let rows = span.start * n..span.end * n;
            conv_span(
                &b[rows.clone()],
                &x[rows.clone()],
                &mut c[rows],
                state,
                self.batch.positions[span.start] == 0,
                kernel,
                (conv.taps, n),
                &mut saves,
            );
        }
        self.put(Buf::Attn, c);
        Ok(())
    }

    fn delta_conv(&mut self, d: &DeltaNet) -> Result<()> {
        let n = d.shape.channels();
        let kernel = d.kernel.of(self.w.arena);
        let state = self.delta_state(d)?;
        let conv = state.start..state.start + d.shape.conv_floats();
        let mut mix = self.take(Buf::Mix);
        for (seq, span) in self.batch.spans().into_iter().enumerate() {
            let (state, mut saves) = seq_states(self.batch, &mut self.kv.states, seq, &conv)?;
            conv_silu_span(
                &mut mix[span.start * n..span.end * n],
                state,
                self.batch.positions[span.start] == 0,
                kernel,
                (d.shape.taps, n),
                &mut saves,
            );
        }
        self.put(Buf::Mix, mix);
        Ok(())
    }

    fn delta_rule(&mut self, d: &DeltaNet) -> Result<()> {
        let state = self.delta_state(d)?;
        let matrices = state.start + d.shape.conv_floats()..state.end;
        let mut z = self.take(Buf::Z);
        let mut mix = self.take(Buf::Mix);
        normalize_qk(&mut mix, &d.shape, d.eps);
        for (seq, span) in self.batch.spans().into_iter().enumerate() {
            let (s, mut saves) = seq_states(self.batch, &mut self.kv.states, seq, &matrices)?;
            if self.batch.positions[span.start] == 0 {
                s.fill(0.0);
            }
            let inputs = DeltaInputs {
                mix: &mix,
                beta: &self.bufs.bufs[index(Buf::Beta)],
                alpha: &self.bufs.bufs[index(Buf::Alpha)],
                arena: self.w.arena,
                d,
            };
            delta_span(&inputs, span, s, &mut saves, &mut z);
        }
        self.put(Buf::Mix, mix);
        self.put(Buf::Z, z);
        Ok(())
    }

    fn gather(&mut self, rows: &[usize]) -> Result<()> {
        let e = self.shape.widths.embd;
        self.gathered = rows.len();
        let mut head = self.take(Buf::Head);
        head.clear();
        let x = &self.bufs.bufs[index(Buf::X)];
        for &r in rows {
            head.extend_from_slice(&x[r * e..(r + 1) * e]);
        }
        self.put(Buf::Head, head);
        Ok(())
    }
}

/// One op's part (`part` of each slot) of sequence `seq`'s recurrent state in this step, and
/// of the snapshots the step writes beside it (each with the span's tokens before it).
fn seq_states<'s>(
    batch: &BatchMeta,
    states: &'s mut StateSlots,
    seq: usize,
    part: &std::ops::Range<usize>,
) -> Result<StateParts<'s>> {
    let Some(slot) = batch.state_slots[seq] else {
        anyhow::bail!("a sequence of a hybrid model has no state slot");
    };
    let saves: Vec<&StateSaveAt> = batch.state_saves.iter().filter(|v| v.seq == seq).collect();
    let to: Vec<usize> = saves.iter().map(|v| v.slot as usize).collect();
    let count = states.count();
    let Some((state, snapshots)) = states.several_mut(slot as usize, &to) else {
        anyhow::bail!("state slot {slot} and snapshot slots {to:?} are not distinct slots of the pool's {count}");
    };
    let snapshots = saves
        .iter()
        .zip(snapshots)
        .map(|(v, s)| (v.after, &mut s[part.clone()]))
        .collect();
    Ok((&mut state[part.clone()], snapshots))
}

/// A sequence's state (one op's part of it) and the snapshots a step writes beside it.
type StateParts<'s> = (&'s mut [f32], Vec<(usize, &'s mut [f32])>);

/// L2-normalises every token's q and k heads in a row of convolved channels (the v channels
/// are left as they are).
fn normalize_qk(mix: &mut [f32], d: &DeltaNetShape, eps: f32) {
    let (n, hd, keys) = (d.channels(), d.head_dim, 2 * d.key_dim());
    for_row_chunks(mix, n, |_, rows| {
        for row in rows.chunks_exact_mut(n) {
            row[..keys]
                .chunks_exact_mut(hd)
                .for_each(|head| l2_normalize(head, eps));
        }
    });
}

/// What the delta rule of one layer reads for a step.
struct DeltaInputs<'a> {
    /// The convolved q, k (L2-normalised) and v channels, one row per token.
    mix: &'a [f32],
    /// The β and α logits, one per value head and token.
    beta: &'a [f32],
    alpha: &'a [f32],
    arena: &'a [f32],
    d: &'a DeltaNet,
}

/// The delta rule over one sequence's `span` of tokens, from its heads' matrices `s` (left
/// holding the span's last state; each of `saves`, the span's tokens before a snapshot and its
/// matrices, gets the state there); each token's gated-normed output written over its z in
/// `z`. Heads run in parallel: each owns its matrix, its part of every snapshot and of every
/// output row.
fn delta_span(
    x: &DeltaInputs<'_>,
    span: std::ops::Range<usize>,
    s: &mut [f32],
    saves: &mut [(usize, &mut [f32])],
    z: &mut [f32],
) {
    let d = x.d.shape;
    let (hd, width, n) = (d.head_dim, d.value_dim(), d.channels());
    let (dt_bias, a) = (x.d.dt_bias.of(x.arena), x.d.a.of(x.arena));
    let norm = x.d.norm.of(x.arena);
    let (states, outs) = (SharedSlice::new(s), SharedSlice::new(z));
    let snapshots: Vec<(usize, SharedSlice<f32>)> = saves
        .iter_mut()
        .map(|(t, to)| (span.start + *t, SharedSlice::new(to)))
        .collect();
    super::pool::parallel_for(d.v_heads, |h| {
        // SAFETY: head h's matrix is this task's alone.
        let s = unsafe { states.slice_mut(h * hd * hd, hd * hd) };
        let (q, k, v) = head_ranges(&d, h);
        let mut o = vec![0f32; hd];
        for t in span.clone() {
            let row = &x.mix[t * n..(t + 1) * n];
            let step = DeltaStep {
                q: &row[q.clone()],
                k: &row[k.clone()],
                v: &row[v.clone()],
                beta: x.beta[t * d.v_heads + h],
                alpha: x.alpha[t * d.v_heads + h],
                dt_bias: dt_bias[h],
                a: a[h],
            };
            delta_step(s, &step, &mut o);
            // SAFETY: head h's values of token t's output row are this task's alone.
            let z = unsafe { outs.slice_mut(t * width + h * hd, hd) };
            gated_rmsnorm(&o, norm, x.d.eps, z);
            for (_, to) in snapshots.iter().filter(|(end, _)| *end == t + 1) {
                // SAFETY: head h's matrix in a snapshot is this task's alone.
                unsafe { to.slice_mut(h * hd * hd, hd * hd) }.copy_from_slice(s);
            }
        }
    });
}

/// Per KV group, each token of `batch` as attention sees it: its block table, the last and
/// first positions it attends to, and its path. A token attends through its own position, or
/// further where its input row says so (an image whose positions see each other).
fn attn_tokens<'a>(batch: &'a BatchMeta, layout: &KvLayout) -> Vec<Vec<AttnToken<'a>>> {
    let n = batch.len();
    let span_len = batch.span_lengths();
    let mut through = batch.positions.clone();
    for input in &batch.inputs {
        through[input.token] = input.through;
    }
    (0..layout.num_groups())
        .map(|g| {
            (0..n)
                .map(|i| AttnToken {
                    block_table: &batch.block_tables[batch.seq_of[i]][g],
                    pos: through[i],
                    first: layout.first_visible(g, batch.positions[i]),
                    // ggml's tiled path for long prompt spans, as the peer; and for the
                    // tokens the model generates, where no peer arithmetic is held to: its
                    // vector softmax costs less than the per-row path's scalar one, and a run
                    // of drafts shares each decoded tile.
                    tiled: span_len[batch.seq_of[i]] >= TILE || batch.is_generated(i),
                })
                .collect()
        })
        .collect()
}
