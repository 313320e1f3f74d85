//! The KV page memory: one allocation, made once, holding every block of every layer.
//!
//! Layout: `[layer][block][k|v][kv_head][slot][row_bytes]`. Only the KV heads are stored
//! (GQA-aware): query heads that share a KV head read the same rows.

use super::{KvType, StateSlots};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageGeometry {
    pub layers: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
    pub kv_type: KvType,
}

impl PageGeometry {
    pub fn row_bytes(&self) -> usize {
        self.kv_type
            .row_bytes(self.head_dim)
            .expect("geometry validated at construction")
    }

    /// KV bytes one token takes across all layers (K and V).
    pub fn bytes_per_token(&self) -> usize {
        2 * self.layers * self.kv_heads * self.row_bytes()
    }

    /// Bytes of one block across all layers: the unit the pool hands out.
    pub fn block_bytes(&self) -> usize {
        self.bytes_per_token() * self.block_size
    }

    fn head_bytes(&self) -> usize {
        self.block_size * self.row_bytes()
    }
}

pub struct KvPages {
    geom: PageGeometry,
    blocks: usize,
    data: Vec<u8>,
    /// A hybrid model's recurrent-state slots (none for a model that only attends).
    pub states: StateSlots,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    K = 0,
    V = 1,
}

impl KvPages {
    /// Allocates the whole pool at once. Fails (instead of aborting) when memory is short.
    pub fn new(geom: PageGeometry, blocks: usize) -> anyhow::Result<KvPages> {
        if geom.kv_type.row_bytes(geom.head_dim).is_none() {
            anyhow::bail!(
                "head_dim {} is not a multiple of the {} block size",
                geom.head_dim,
                geom.kv_type
            );
        }
        if geom.block_size == 0 || blocks == 0 {
            anyhow::bail!("the KV pool needs at least one block of at least one token");
        }
        let bytes = geom
            .block_bytes()
            .checked_mul(blocks)
            .ok_or_else(|| anyhow::anyhow!("KV pool size overflows"))?;
        let mut data = Vec::new();
        data.try_reserve_exact(bytes)
            .map_err(|_| anyhow::anyhow!("cannot allocate {bytes} bytes for the KV pool"))?;
        data.resize(bytes, 0);
        Ok(KvPages {
            geom,
            blocks,
            data,
            states: StateSlots::default(),
        })
    }

    pub fn geometry(&self) -> &PageGeometry {
        &self.geom
    }

    pub fn blocks(&self) -> usize {
        self.blocks
    }

    /// Bytes of the pages and the state slots.
    pub fn total_bytes(&self) -> usize {
        self.data.len() + self.states.bytes()
    }

    /// Byte offset of the first row of (layer, block, part, head).
    fn head_offset(&self, layer: usize, block: usize, part: Part, head: usize) -> usize {
        let g = &self.geom;
        (((layer * self.blocks + block) * 2 + part as usize) * g.kv_heads + head) * g.head_bytes()
    }

    /// All `block_size` rows of one head in one block (what attention walks through).
    pub fn head_rows(&self, layer: usize, block: usize, part: Part, head: usize) -> &[u8] {
        let off = self.head_offset(layer, block, part, head);
        &self.data[off..off + self.geom.head_bytes()]
    }

    /// Writes one token's row for one head.
    pub fn write_row(&mut self, layer: usize, slot: usize, part: Part, head: usize, row: &[f32]) {
        let (block, within) = (slot / self.geom.block_size, slot % self.geom.block_size);
        let rb = self.geom.row_bytes();
        let off = self.head_offset(layer, block, part, head) + within * rb;
        self.geom
            .kv_type
            .encode_row(row, &mut self.data[off..off + rb]);
    }

    /// Every layer's K and V rows of `block`, in layer order (what the prefix cache saves).
    pub fn block_image(&self, block: usize) -> Vec<u8> {
        let g = self.geom;
        let span = 2 * g.kv_heads * g.head_bytes();
        let mut out = Vec::with_capacity(span * g.layers);
        for layer in 0..g.layers {
            let at = self.head_offset(layer, block, Part::K, 0);
            out.extend_from_slice(&self.data[at..at + span]);
        }
        out
    }

    /// Puts back an image [`KvPages::block_image`] made of a block of this geometry.
    pub fn set_block_image(&mut self, block: usize, image: &[u8]) {
        let g = self.geom;
        let span = 2 * g.kv_heads * g.head_bytes();
        assert_eq!(
            image.len(),
            span * g.layers,
            "an image of this geometry's block"
        );
        for (layer, rows) in image.chunks_exact(span).enumerate() {
            let at = self.head_offset(layer, block, Part::K, 0);
            self.data[at..at + span].copy_from_slice(rows);
        }
    }

    /// Copies every layer's rows of block `src` into block `dst` (copy-on-write of a shared,
    /// partly filled block).
    pub fn copy_block(&mut self, src: usize, dst: usize) {
        let g = self.geom;
        let span = 2 * g.kv_heads * g.head_bytes();
        for layer in 0..g.layers {
            let s = self.head_offset(layer, src, Part::K, 0);
            let d = self.head_offset(layer, dst, Part::K, 0);
            self.data.copy_within(s..s + span, d);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smollm_f16_bytes_per_token() {
        let g = PageGeometry {
            layers: 30,
            kv_heads: 3,
            head_dim: 64,
            block_size: 16,
            kv_type: KvType::F16,
        };
        assert_eq!(g.bytes_per_token(), 23_040);
    }

    #[test]
    fn rows_land_in_their_own_place() {
        let g = PageGeometry {
            layers: 2,
            kv_heads: 2,
            head_dim: 32,
            block_size: 4,
            kv_type: KvType::F16,
        };
        let mut p = KvPages::new(g, 3).unwrap();
        let row: Vec<f32> = (0..32).map(|i| i as f32).collect();
        p.write_row(1, 6, Part::V, 1, &row); // block 1, slot 2
        let rows = p.head_rows(1, 1, Part::V, 1);
        let mut back = vec![0f32; 32];
        KvType::F16.decode_row(&rows[2 * 64..3 * 64], &mut back);
        assert_eq!(back, row);
        assert!(p.head_rows(1, 1, Part::K, 1).iter().all(|&b| b == 0));
        p.copy_block(1, 2);
        assert_eq!(p.head_rows(1, 2, Part::V, 1), p.head_rows(1, 1, Part::V, 1));
    }
}
