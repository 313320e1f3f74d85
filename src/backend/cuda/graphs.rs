//! Decode steps as CUDA graphs. A decode step of a small model is hundreds of short kernels;
//! launched one by one their launch overhead, not the weight reads, sets the step time. A
//! graph replays the whole step with one launch.
//!
//! One graph per batch-size bucket (powers of two up to `max_seqs` rounded up), captured the
//! first time a decode batch of that bucket runs, with the batch padded up to the bucket (the
//! padding tokens use the pool's spare block). What changes between steps (token ids,
//! positions, slots, block tables, RoPE angles) lives in workspace buffers at fixed addresses
//! that the step fills before launching, so a captured graph stays valid for the executor's life.
//! If capture fails once, graphs are switched off (with one log line) and every step launches
//! its kernels plainly.

use cudarc::driver::sys::{CUgraphInstantiate_flags_enum, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, CudaStream};
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::Arc;

/// The bucket a decode batch of `n` sequences is padded to, if it has one (`n <= max`).
pub fn bucket(n: usize, max: usize) -> Option<usize> {
    let b = n.max(1).next_power_of_two();
    (b <= max).then_some(b)
}

/// A captured graph owned by the executor.
struct Graph(CudaGraph);

// SAFETY: a CUDA graph must not be used from two threads at once; the executor owning it is
// used by one thread at a time (the engine thread, after being moved there at start-up).
unsafe impl Send for Graph {}

#[derive(Default)]
pub struct DecodeGraphs {
    graphs: HashMap<usize, Graph>,
    disabled: bool,
}

impl DecodeGraphs {
    pub fn disabled() -> DecodeGraphs {
        DecodeGraphs {
            graphs: HashMap::new(),
            disabled: true,
        }
    }

    pub fn enabled(&self) -> bool {
        !self.disabled
    }

    pub fn captured(&self) -> usize {
        self.graphs.len()
    }

    /// Launches the graph of `bucket`, capturing it first from `enqueue` (which must only
    /// launch kernels on `stream`). `Ok(false)`: no graph (capture failed now or before): the
    /// caller launches the step plainly.
    pub fn launch(
        &mut self,
        stream: &Arc<CudaStream>,
        bucket: usize,
        enqueue: impl FnOnce() -> Result<(), String>,
    ) -> Result<bool, String> {
        if self.disabled {
            return Ok(false);
        }
        let graph = match self.graphs.entry(bucket) {
            Entry::Occupied(o) => o.into_mut(),
            Entry::Vacant(slot) => match capture(stream, enqueue) {
                Ok(g) => {
                    log::debug!("CUDA: decode graph captured for batches of {bucket}");
                    slot.insert(Graph(g))
                }
                Err(e) => {
                    log::warn!(
                        "CUDA: capturing a decode graph failed ({e}); launching kernels one by one"
                    );
                    self.disabled = true;
                    return Ok(false);
                }
            },
        };
        graph
            .0
            .launch()
            .map(|_| true)
            .map_err(|e| format!("launching a decode graph failed: {e:?}"))
    }
}

fn capture(
    stream: &Arc<CudaStream>,
    enqueue: impl FnOnce() -> Result<(), String>,
) -> Result<CudaGraph, String> {
    stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .map_err(|e| format!("cuStreamBeginCapture: {e:?}"))?;
    let queued = enqueue();
    // End the capture whatever happened, so the stream is usable again.
    let graph = stream.end_capture(CUgraphInstantiate_flags_enum(0));
    queued?;
    graph
        .map_err(|e| format!("cuStreamEndCapture: {e:?}"))?
        .ok_or_else(|| "the capture recorded nothing".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_powers_of_two_up_to_the_max() {
        assert_eq!(bucket(1, 16), Some(1));
        assert_eq!(bucket(3, 16), Some(4));
        assert_eq!(bucket(16, 16), Some(16));
        assert_eq!(bucket(17, 16), None);
        assert_eq!(bucket(9, 12), None);
    }
}
