//! A deterministic stand-in for the model's executor, so the engine's steps run in unit tests
//! without a model file. Its "model" counts: after token `t` comes `(t + 1) % VOCAB`, so every
//! expected output is known. It keeps its KV the way a real executor does, one token per slot
//! of the pages the block tables name, and reads a row's last token back from there, so a
//! position the engine wrongly counts as computed shows in the store.

use crate::engine::executor::StepExecutor;
use crate::engine::sampler::{argmax, SamplingParams};
use crate::model::BatchMeta;
use anyhow::{bail, Result};
use std::sync::{Arc, Mutex};

/// The fake vocabulary's size.
pub const VOCAB: usize = 64;

/// The width of the fake model's hidden rows: token `t`'s is `(t, 1)`.
pub const HIDDEN: usize = 2;

/// The token the fake model puts after `t`.
pub fn next_token(t: u32) -> u32 {
    (t + 1) % VOCAB as u32
}

/// What the fake executor shares with its test.
#[derive(Default)]
pub struct FakeState {
    /// The token whose K/V each slot holds (`block * block_size + offset`).
    pub kv: Vec<Option<u32>>,
    /// Every forward pass's batch, in order (failed ones too).
    pub batches: Vec<BatchMeta>,
    /// The next forward pass fails.
    pub fail_next: bool,
}

/// The test's view of a [`FakeExecutor`] it handed to an engine.
#[derive(Clone)]
pub struct FakeProbe {
    state: Arc<Mutex<FakeState>>,
    block_size: usize,
}

impl FakeProbe {
    /// The token whose K/V is at `pos` of a sequence with block table `table`.
    pub fn kv_at(&self, table: &[u32], pos: usize) -> Option<u32> {
        let slot = table[pos / self.block_size] as usize * self.block_size + pos % self.block_size;
        self.state.lock().unwrap().kv[slot]
    }

    pub fn batches(&self) -> Vec<BatchMeta> {
        self.state.lock().unwrap().batches.clone()
    }

    pub fn last_batch(&self) -> BatchMeta {
        self.batches().pop().expect("a forward pass ran")
    }

    pub fn fail_next(&self) {
        self.state.lock().unwrap().fail_next = true;
    }
}

pub struct FakeExecutor {
    state: Arc<Mutex<FakeState>>,
    blocks: usize,
    block_size: usize,
    /// The last step's hidden rows.
    hidden: Vec<f32>,
}

impl FakeExecutor {
    /// An executor with a pool of `blocks` blocks of `block_size` tokens, and its probe.
    pub fn new(blocks: usize, block_size: usize) -> (FakeExecutor, FakeProbe) {
        let state = Arc::new(Mutex::new(FakeState {
            kv: vec![None; blocks * block_size],
            ..FakeState::default()
        }));
        let probe = FakeProbe {
            state: state.clone(),
            block_size,
        };
        let exec = FakeExecutor {
            state,
            blocks,
            block_size,
            hidden: Vec::new(),
        };
        (exec, probe)
    }

    /// Writes the batch's K/V, then answers each logits row with the token after the one
    /// its position holds (read back from the store, as attention would read it).
    fn next_tokens(&mut self, batch: &BatchMeta) -> Result<Vec<u32>> {
        let bs = self.block_size;
        let mut st = self.state.lock().unwrap();
        st.batches.push(batch.clone());
        if std::mem::take(&mut st.fail_next) {
            bail!("the fake executor was told to fail this step");
        }
        let slot = |i: usize| {
            let (pos, table) = (batch.positions[i], &batch.block_tables[batch.seq_of[i]][0]);
            table[pos / bs] as usize * bs + pos % bs
        };
        for (i, &t) in batch.tokens.iter().enumerate() {
            st.kv[slot(i)] = Some(t);
        }
        self.hidden.clear();
        for &i in &batch.hidden_for {
            self.hidden.extend([batch.tokens[i] as f32, 1.0]);
        }
        batch
            .logits_for
            .iter()
            .map(|&i| match st.kv[slot(i)] {
                Some(t) => Ok(next_token(t)),
                None => bail!("position {} has no K/V", batch.positions[i]),
            })
            .collect()
    }
}

impl StepExecutor for FakeExecutor {
    fn is_cuda(&self) -> bool {
        false
    }

    fn backend_name(&self) -> &'static str {
        "fake"
    }

    fn blocks(&self) -> usize {
        self.blocks
    }

    fn kv_bytes(&self) -> usize {
        self.blocks * self.block_size
    }

    fn copy_block(&mut self, src: usize, dst: usize) -> Result<()> {
        let bs = self.block_size;
        let mut st = self.state.lock().unwrap();
        st.kv.copy_within(src * bs..(src + 1) * bs, dst * bs);
        Ok(())
    }

    fn state_slots(&self) -> usize {
        0
    }

    fn copy_state(&mut self, _: usize, _: usize) -> Result<()> {
        anyhow::bail!("the fake executor keeps no recurrent state")
    }

    fn release_step_buffers(&mut self) {}

    fn recycle(&mut self, _logits: Vec<f32>) {}

    /// One-hot rows: the next token's logit is 1, every other 0.
    fn forward(&mut self, batch: &BatchMeta) -> Result<Vec<f32>> {
        let mut logits = Vec::new();
        for t in self.next_tokens(batch)? {
            let mut row = vec![0.0; VOCAB];
            row[t as usize] = 1.0;
            logits.extend(row);
        }
        Ok(logits)
    }

    /// Only a CUDA executor samples rows; the engine never asks this one to.
    fn forward_sample(
        &mut self,
        _batch: &BatchMeta,
        _rows: &[(SamplingParams, u64)],
    ) -> Result<Vec<u32>> {
        bail!("the fake executor does not sample")
    }

    fn forward_greedy(&mut self, batch: &BatchMeta) -> Result<Vec<u32>> {
        let logits = self.forward(batch)?;
        Ok(logits.chunks_exact(VOCAB).map(argmax).collect())
    }

    fn take_hidden(&mut self) -> Vec<f32> {
        std::mem::take(&mut self.hidden)
    }
}
