//! KV sizing arithmetic: what a memory budget buys in blocks and concurrent sequences.
//! Used by the engine at start-up (its log line) and by `edgelm kv-plan`.

use super::{KvType, PageGeometry};
use serde::Serialize;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct KvPlan {
    pub kv_type: KvType,
    pub kv_bytes_per_token: usize,
    pub block_tokens: usize,
    pub block_bytes: usize,
    pub memory_bytes: usize,
    pub pool_blocks: usize,
    pub ctx: usize,
    pub avg_tokens: usize,
    /// Sequences of `avg_tokens` that fit when memory is reserved a block at a time.
    pub max_seqs_paged: usize,
    /// Sequences that fit when each reserves the full context up front.
    pub max_seqs_contiguous: usize,
    /// The same model shape without GQA (KV heads = query heads).
    pub no_gqa_kv_bytes_per_token: usize,
    pub no_gqa_max_seqs_paged: usize,
    pub no_gqa_max_seqs_contiguous: usize,
}

impl KvPlan {
    pub fn new(
        geom: &PageGeometry,
        n_head: usize,
        memory_bytes: usize,
        ctx: usize,
        avg_tokens: usize,
    ) -> KvPlan {
        let per_token = geom.bytes_per_token();
        let block_bytes = geom.block_bytes();
        let pool_blocks = memory_bytes / block_bytes;
        let blocks_per_seq = avg_tokens.max(1).div_ceil(geom.block_tokens);
        let no_gqa = PageGeometry {
            kv_heads: n_head,
            ..*geom
        };
        let no_gqa_blocks = memory_bytes / no_gqa.block_bytes();
        KvPlan {
            kv_type: geom.kv_type,
            kv_bytes_per_token: per_token,
            block_tokens: geom.block_tokens,
            block_bytes,
            memory_bytes,
            pool_blocks,
            ctx,
            avg_tokens,
            max_seqs_paged: pool_blocks / blocks_per_seq,
            max_seqs_contiguous: memory_bytes / (per_token * ctx.max(1)),
            no_gqa_kv_bytes_per_token: no_gqa.bytes_per_token(),
            no_gqa_max_seqs_paged: no_gqa_blocks / blocks_per_seq,
            no_gqa_max_seqs_contiguous: memory_bytes / (no_gqa.bytes_per_token() * ctx.max(1)),
        }
    }

    /// Concurrent sequences of `tokens` tokens each that the pool holds.
    pub fn seqs_at(&self, tokens: usize) -> usize {
        self.pool_blocks / tokens.max(1).div_ceil(self.block_tokens)
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
            block_tokens: 16,
            kv_type,
        }
    }

    #[test]
    fn smollm_bytes_per_token_by_format() {
        let f16 = KvPlan::new(&smollm(KvType::F16), 9, 1 << 30, 8192, 512);
        assert_eq!(f16.kv_bytes_per_token, 23_040);
        assert_eq!(f16.no_gqa_kv_bytes_per_token, 69_120);
        // q8_0: 34 bytes per 32 values; q4_0: 18 bytes per 32 values.
        assert_eq!(
            KvPlan::new(&smollm(KvType::Q8_0), 9, 1 << 30, 8192, 512).kv_bytes_per_token,
            12_240
        );
        assert_eq!(
            KvPlan::new(&smollm(KvType::Q4_0), 9, 1 << 30, 8192, 512).kv_bytes_per_token,
            6_480
        );
    }

    #[test]
    fn paging_beats_contiguous_reservation() {
        let p = KvPlan::new(&smollm(KvType::F16), 9, 1 << 30, 8192, 512);
        assert_eq!(p.block_bytes, 23_040 * 16);
        assert_eq!(p.pool_blocks, (1 << 30) / (23_040 * 16));
        assert!(p.max_seqs_paged >= 4 * p.max_seqs_contiguous.max(1));
        assert_eq!(p.seqs_at(512), p.max_seqs_paged);
    }
}
