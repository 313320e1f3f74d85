//! KV sizing arithmetic: what a memory budget buys in blocks and concurrent sequences, with
//! attention windows counted (a windowed KV group holds only its window's blocks).
//! Used by the engine at start-up (its log line) and by `edgelm kv-plan`.

use super::{snapshot_count, KvLayout, KvType, PageGeometry, SNAPSHOT_STRIDE_TOKENS};
use serde::Serialize;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct KvPlan {
    pub kv_type: KvType,
    /// Bytes one token's K and V take in every layer (what full attention holds per token).
    pub kv_bytes_per_token: usize,
    pub block_size: usize,
    /// Bytes of one block (one KV group's layers).
    pub block_bytes: usize,
    /// KV groups (blocks per position without windows) and how many have a window.
    pub kv_groups: usize,
    pub windowed_groups: usize,
    pub memory_bytes: usize,
    pub pool_blocks: usize,
    pub ctx: usize,
    /// Bytes one sequence of `ctx` tokens holds, windows counted.
    pub kv_bytes_per_sequence: usize,
    /// The same without windows (every layer holding every position).
    pub full_attention_bytes_per_sequence: usize,
    pub avg_tokens: usize,
    /// Sequences of `avg_tokens` that fit when memory is reserved a block at a time.
    pub max_seqs_paged: usize,
    /// Sequences that fit when each reserves the full context up front.
    pub max_seqs_contiguous: usize,
    /// The same model shape without GQA (KV heads = query heads).
    pub no_gqa_kv_bytes_per_token: usize,
    pub no_gqa_max_seqs_paged: usize,
    pub no_gqa_max_seqs_contiguous: usize,
    /// A hybrid's recurrent state per running sequence (whatever its length), held in a slot
    /// beside the KV pages; 0 for a model that only attends.
    pub state_bytes_per_sequence: usize,
    /// A hybrid's prefix cache: the state snapshots its budget holds (one every
    /// `state_snapshot_stride_tokens` of a cached prompt) and their bytes.
    pub state_snapshots: usize,
    pub state_snapshot_bytes: usize,
    pub state_snapshot_stride_tokens: usize,
    #[serde(skip)]
    layout: KvLayout,
}

impl KvPlan {
    pub fn new(
        geom: &PageGeometry,
        layout: &KvLayout,
        n_head: usize,
        memory_bytes: usize,
        ctx: usize,
        avg_tokens: usize,
    ) -> KvPlan {
        let groups = layout.num_groups();
        let per_token = geom.bytes_per_token() * groups;
        let block_bytes = geom.block_bytes();
        let pool_blocks = memory_bytes / block_bytes;
        let bt = geom.block_size;
        let per_seq = |tokens: usize| layout.blocks_for_sequence(tokens.max(1), bt);
        let no_gqa = PageGeometry {
            kv_heads: n_head,
            ..*geom
        };
        let no_gqa_blocks = memory_bytes / no_gqa.block_bytes();
        KvPlan {
            kv_type: geom.kv_type,
            kv_bytes_per_token: per_token,
            block_size: bt,
            block_bytes,
            kv_groups: groups,
            windowed_groups: layout.groups.iter().filter(|g| g.window.is_some()).count(),
            memory_bytes,
            pool_blocks,
            ctx,
            kv_bytes_per_sequence: per_seq(ctx) * block_bytes,
            full_attention_bytes_per_sequence: ctx.max(1).div_ceil(bt) * groups * block_bytes,
            avg_tokens,
            max_seqs_paged: pool_blocks / per_seq(avg_tokens),
            max_seqs_contiguous: memory_bytes / (per_token * ctx.max(1)),
            no_gqa_kv_bytes_per_token: no_gqa.bytes_per_token() * groups,
            no_gqa_max_seqs_paged: no_gqa_blocks / per_seq(avg_tokens),
            no_gqa_max_seqs_contiguous: memory_bytes
                / (no_gqa.bytes_per_token() * groups * ctx.max(1)),
            state_bytes_per_sequence: 0,
            state_snapshots: 0,
            state_snapshot_bytes: 0,
            state_snapshot_stride_tokens: 0,
            layout: layout.clone(),
        }
    }

    /// A hybrid's recurrent state: `state_bytes` per sequence, and the prefix cache's
    /// snapshots that `snapshot_budget` bytes hold.
    pub fn with_state(mut self, state_bytes: usize, snapshot_budget: usize) -> KvPlan {
        self.state_bytes_per_sequence = state_bytes;
        self.state_snapshots = snapshot_count(snapshot_budget, state_bytes);
        self.state_snapshot_bytes = self.state_snapshots * state_bytes;
        self.state_snapshot_stride_tokens = SNAPSHOT_STRIDE_TOKENS;
        self
    }

    /// Concurrent sequences of `tokens` tokens each that the pool holds.
    pub fn seqs_at(&self, tokens: usize) -> usize {
        self.pool_blocks
            / self
                .layout
                .blocks_for_sequence(tokens.max(1), self.block_size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn smollm(kv_type: KvType) -> PageGeometry {
        PageGeometry {
            layers: 30,
            kv_heads: 3,
            head_dim: 64,
            block_size: 16,
            kv_type,
        }
    }

    fn plan(kv_type: KvType) -> KvPlan {
        KvPlan::new(&smollm(kv_type), &KvLayout::full(30), 9, 1 << 30, 8192, 512)
    }

    #[test]
    fn smollm_bytes_per_token_by_format() {
        let f16 = plan(KvType::F16);
        assert_eq!(f16.kv_bytes_per_token, 23_040);
        assert_eq!(f16.no_gqa_kv_bytes_per_token, 69_120);
        // q8_0: 34 bytes per 32 values; q4_0: 18 bytes per 32 values.
        assert_eq!(plan(KvType::Q8_0).kv_bytes_per_token, 12_240);
        assert_eq!(plan(KvType::Q4_0).kv_bytes_per_token, 6_480);
    }

    #[test]
    fn paging_beats_contiguous_reservation() {
        let p = plan(KvType::F16);
        assert_eq!(p.block_bytes, 23_040 * 16);
        assert_eq!(p.pool_blocks, (1 << 30) / (23_040 * 16));
        assert!(p.max_seqs_paged >= 4 * p.max_seqs_contiguous.max(1));
        assert_eq!(p.seqs_at(512), p.max_seqs_paged);
        assert_eq!(p.kv_bytes_per_sequence, p.full_attention_bytes_per_sequence);
    }

    #[test]
    fn windows_shrink_what_a_long_sequence_holds() {
        // Gemma 3 270M's shape: 18 layers, 1 KV head of 256, windows of 512 on 5 layers of 6.
        let windows: Vec<Option<usize>> = (0..18).map(|l| (l % 6 != 5).then_some(512)).collect();
        let layout = KvLayout::new(&windows);
        let geom = PageGeometry {
            layers: layout.layers_per_group(),
            kv_heads: 1,
            head_dim: 256,
            block_size: 16,
            kv_type: KvType::F16,
        };
        let p = KvPlan::new(&geom, &layout, 4, 256 << 20, 32768, 512);
        assert_eq!(p.kv_bytes_per_token, 18 * 2 * 512);
        assert!(
            (p.kv_bytes_per_sequence as f64) < 0.2 * p.full_attention_bytes_per_sequence as f64
        );
        assert_eq!((p.kv_groups, p.windowed_groups), (6, 5));
    }
}
