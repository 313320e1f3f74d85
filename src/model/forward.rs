//! One forward pass over a batch of token spans, reading and writing K/V in the paged pool.

use super::{BatchMeta, Model};
use crate::backend::cpu::attention::{paged_attention, AttnShape, AttnToken, TILE};
use crate::backend::cpu::matmul::{embed, matmul, matmul_fused, WeightRef};
use crate::backend::cpu::ops::{
    add_bias, add_in_place, hadamard_64, rmsnorm, rope_apply, rope_cos_sin, silu_mul, HADAMARD_DIM,
};
use crate::kv::{KvPages, KvType, Part};
use crate::model::Mat;
use anyhow::Result;

impl Model {
    /// Runs the batch; returns `batch.logits_for.len()` rows of `vocab_size` logits.
    pub fn forward(&self, batch: &BatchMeta, kv: &mut KvPages) -> Result<Vec<f32>> {
        let cfg = &self.config;
        let geom = *kv.geometry();
        batch.validate(
            geom.block_tokens,
            kv.blocks(),
            cfg.vocab_size,
            cfg.context_length.max(1) * 64,
        )?;
        if geom.layers != cfg.n_layers
            || geom.kv_heads != cfg.n_head_kv
            || geom.head_dim != cfg.head_dim
        {
            anyhow::bail!("KV pool geometry {geom:?} does not fit the model");
        }
        let n = batch.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        let (e, hd) = (cfg.n_embd, cfg.head_dim);
        let w = &self.weights;
        let file = &*self.file;
        let mm = |m: &Mat, x: &[f32], out: &mut [f32]| {
            matmul(m.data(file), m.ty, m.rows, m.cols, x, out)
        };
        let weight = |m: &Mat| WeightRef {
            w: m.data(file),
            ty: m.ty,
            rows: m.rows,
            cols: m.cols,
        };

        let mut x = vec![0f32; n * e];
        embed(
            w.token_embd.data(file),
            w.token_embd.ty,
            e,
            &batch.tokens,
            &mut x,
        );

        // RoPE angles per token, shared by all layers.
        let half = cfg.n_rot / 2;
        let mut cs = vec![(0f32, 0f32); n * half];
        for (i, c) in cs.chunks_exact_mut(half.max(1)).enumerate().take(n) {
            rope_cos_sin(
                batch.positions[i],
                cfg.n_rot,
                cfg.rope_theta,
                w.rope_freqs.as_deref(),
                c,
            );
        }
        let slots: Vec<usize> = (0..n).map(|i| batch.slot(i, geom.block_tokens)).collect();
        let span_len = batch.span_lengths();
        let attn_tokens: Vec<AttnToken<'_>> = (0..n)
            .map(|i| AttnToken {
                block_table: &batch.block_tables[batch.seq_of[i]],
                pos: batch.positions[i],
                tiled: span_len[batch.seq_of[i]] >= TILE,
            })
            .collect();
        // Quantized pages hold K and V rotated (see `hadamard_64`); Q follows K's rotation and
        // the attention output is rotated back.
        let rotate = geom.kv_type != KvType::F16 && hd % HADAMARD_DIM == 0;
        let shape = AttnShape {
            n_head: cfg.n_head,
            n_head_kv: cfg.n_head_kv,
            head_dim: hd,
        };

        let mut h = vec![0f32; n * e];
        let mut q = vec![0f32; n * cfg.q_dim()];
        let mut k = vec![0f32; n * cfg.kv_dim()];
        let mut v = vec![0f32; n * cfg.kv_dim()];
        let mut attn = vec![0f32; n * cfg.q_dim()];
        let mut proj = vec![0f32; n * e];
        let mut gate = vec![0f32; n * cfg.n_ff];
        let mut up = vec![0f32; n * cfg.n_ff];

        for (li, lw) in w.layers.iter().enumerate() {
            rmsnorm(&x, &lw.attn_norm, cfg.rms_eps, &mut h);
            matmul_fused(
                &[weight(&lw.wq), weight(&lw.wk), weight(&lw.wv)],
                &h,
                &mut [&mut q, &mut k, &mut v],
            );
            if let Some(b) = &lw.bq {
                add_bias(&mut q, b);
            }
            if let Some(b) = &lw.bk {
                add_bias(&mut k, b);
            }
            if let Some(b) = &lw.bv {
                add_bias(&mut v, b);
            }
            for i in 0..n {
                let c = &cs[i * half..(i + 1) * half];
                rope_apply(
                    &mut q[i * cfg.q_dim()..(i + 1) * cfg.q_dim()],
                    hd,
                    cfg.n_rot,
                    cfg.rope_layout,
                    c,
                );
                rope_apply(
                    &mut k[i * cfg.kv_dim()..(i + 1) * cfg.kv_dim()],
                    hd,
                    cfg.n_rot,
                    cfg.rope_layout,
                    c,
                );
            }
            if rotate {
                hadamard_64(&mut q);
                hadamard_64(&mut k);
                hadamard_64(&mut v);
            }
            // Write this step's K/V first: tokens later in a span attend to earlier ones.
            for (i, &slot) in slots.iter().enumerate() {
                for g in 0..cfg.n_head_kv {
                    let off = i * cfg.kv_dim() + g * hd;
                    kv.write_row(li, slot, Part::K, g, &k[off..off + hd]);
                    kv.write_row(li, slot, Part::V, g, &v[off..off + hd]);
                }
            }
            paged_attention(kv, li, &shape, &attn_tokens, &q, &mut attn);
            if rotate {
                hadamard_64(&mut attn);
            }
            mm(&lw.wo, &attn, &mut proj);
            add_in_place(&mut x, &proj);

            rmsnorm(&x, &lw.ffn_norm, cfg.rms_eps, &mut h);
            matmul_fused(
                &[weight(&lw.w_gate), weight(&lw.w_up)],
                &h,
                &mut [&mut gate, &mut up],
            );
            silu_mul(&mut gate, &up);
            mm(&lw.w_down, &gate, &mut proj);
            add_in_place(&mut x, &proj);
        }

        // Only the rows whose logits are wanted go through the (large) output projection.
        let m = batch.logits_for.len();
        let mut sel = vec![0f32; m * e];
        for (j, &i) in batch.logits_for.iter().enumerate() {
            sel[j * e..(j + 1) * e].copy_from_slice(&x[i * e..(i + 1) * e]);
        }
        let mut normed = vec![0f32; m * e];
        rmsnorm(&sel, &w.output_norm, cfg.rms_eps, &mut normed);
        let mut logits = vec![0f32; m * cfg.vocab_size];
        mm(&w.output, &normed, &mut logits);
        Ok(logits)
    }
}
