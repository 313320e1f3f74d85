//! The KV pool in device memory: one allocation made at start-up, laid out exactly as
//! src/kv/pages.rs lays out the CPU's pool (`[layer][block][k|v][kv_head][slot][row]`), so the
//! scheduler's block ids and block tables address it unchanged and kernels/kv.cu and
//! kernels/attention.cu compute the same offsets as the CPU.
//!
//! Its size is what the device has left: free memory, measured after the weights and the
//! workspace are in place, minus the profile's reserve (`engine.gpu_reserve_mib`: the CUDA
//! context's own growth, CUDA graphs, and on an integrated board the memory the CPU side
//! keeps). One block more than the scheduler sees is allocated: the decode graphs pad a batch
//! up to its size bucket with tokens that write their K/V into that spare block.
//!
//! A hybrid model's recurrent-state slots (src/kv/states.rs: one per sequence that may run at
//! once, then the prefix cache's snapshots) are allocated beside the pages, before the free
//! memory is measured for them, plus one padding slot that a graph's padding tokens use.

use super::mem::DeviceBuf;
use crate::kv::PageGeometry;
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::CudaContext;
use std::sync::Arc;

/// How big the pool should be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvBudget {
    /// All free device memory but this many bytes (the engine's choice).
    AllBut(usize),
    /// Exactly this many blocks (tests).
    Blocks(usize),
}

/// Blocks the pool gets from `free` bytes of device memory less `reserve`, one block of which
/// is the padding block (so the answer is what the scheduler may use). Errors say what is short.
pub fn blocks_for(free: usize, reserve: usize, block_bytes: usize) -> Result<usize, String> {
    let usable = free.saturating_sub(reserve);
    let blocks = usable / block_bytes.max(1);
    if blocks < 2 {
        return Err(format!(
            "{} MiB of device memory free, {} MiB reserved: no room for a KV pool of {} KiB \
             blocks (lower engine.gpu_reserve_mib)",
            free >> 20,
            reserve >> 20,
            block_bytes >> 10
        ));
    }
    Ok(blocks - 1)
}

/// A hybrid model's state slots: `slots` of `floats` f32 values each (none: 0 slots).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StateShape {
    pub slots: usize,
    pub floats: usize,
}

pub struct KvPool {
    buf: DeviceBuf,
    geom: PageGeometry,
    /// Blocks the scheduler hands out: ids 0..blocks.
    blocks: usize,
    /// The state slots, then the padding slot (one byte when the model has no state).
    states: DeviceBuf,
    state: StateShape,
}

impl KvPool {
    pub fn new(
        ctx: &Arc<CudaContext>,
        geom: PageGeometry,
        budget: KvBudget,
        state: StateShape,
    ) -> Result<KvPool, String> {
        let state = if state.floats == 0 {
            StateShape::default()
        } else {
            state
        };
        let state_bytes = (state.slots + 1)
            .checked_mul(state.floats * 4)
            .ok_or("state slots overflow")?;
        let states = DeviceBuf::zeroed(ctx, state_bytes)?;
        let blocks = match budget {
            KvBudget::Blocks(n) => n.max(1),
            KvBudget::AllBut(reserve) => {
                ctx.bind_to_thread()
                    .map_err(|e| format!("cannot use the CUDA context: {e:?}"))?;
                let (free, _) = cudarc::driver::result::mem_get_info()
                    .map_err(|e| format!("cuMemGetInfo failed: {e:?}"))?;
                blocks_for(free, reserve, geom.block_bytes())?
            }
        };
        let bytes = geom
            .block_bytes()
            .checked_mul(blocks + 1)
            .ok_or("KV pool size overflows")?;
        let buf = DeviceBuf::zeroed(ctx, bytes)?;
        Ok(KvPool {
            buf,
            geom,
            blocks,
            states,
            state,
        })
    }

    pub fn ptr(&self) -> CUdeviceptr {
        self.buf.ptr()
    }

    pub fn geometry(&self) -> &PageGeometry {
        &self.geom
    }

    /// Blocks the scheduler may use.
    pub fn blocks(&self) -> usize {
        self.blocks
    }

    /// Blocks allocated: the kernels' `blocks` argument (the layout's stride).
    pub fn allocated_blocks(&self) -> usize {
        self.blocks + 1
    }

    /// The padding block's id.
    pub fn pad_block(&self) -> usize {
        self.blocks
    }

    pub fn total_bytes(&self) -> usize {
        self.buf.bytes()
    }

    /// The state slots' base address: slot s at `s * state_floats() * 4` bytes.
    pub fn states_ptr(&self) -> CUdeviceptr {
        self.states.ptr()
    }

    /// State slots the scheduler may hand out (0 for a model without recurrent state).
    pub fn state_slots(&self) -> usize {
        self.state.slots
    }

    /// f32 values per state slot.
    pub fn state_floats(&self) -> usize {
        self.state.floats
    }

    /// The padding tokens' state slot.
    pub fn pad_state_slot(&self) -> usize {
        self.state.slots
    }

    /// Device bytes of the state slots (the padding slot included).
    pub fn state_bytes(&self) -> usize {
        if self.state.floats == 0 {
            0
        } else {
            self.states.bytes()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_takes_free_memory_minus_the_reserve() {
        let mib = 1 << 20;
        // 1000 MiB free, 100 reserved, 1 MiB blocks: 900 blocks, one of them the padding.
        assert_eq!(blocks_for(1000 * mib, 100 * mib, mib), Ok(899));
        assert!(blocks_for(100 * mib, 100 * mib, mib).is_err());
        assert!(blocks_for(101 * mib, 200 * mib, mib)
            .unwrap_err()
            .contains("gpu_reserve_mib"));
    }
}
