//! Sharing one output buffer between worker threads that write disjoint parts of it.

/// A raw view of a buffer the tasks of one parallel loop write through.
///
/// SAFETY contract for users: every range handed out by `slice_mut` belongs to exactly one task, and the buffer outlives the
/// parallel loop (it is borrowed mutably around it).
pub struct SharedSlice<T> {
    ptr: *mut T,
    len: usize,
}

impl<T> Clone for SharedSlice<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SharedSlice<T> {}

// SAFETY: only disjoint parts are written concurrently (see the type's contract).
unsafe impl<T: Send> Send for SharedSlice<T> {}
unsafe impl<T: Send> Sync for SharedSlice<T> {}

impl<T> SharedSlice<T> {
    pub fn new(buf: &mut [T]) -> Self {
        SharedSlice {
            ptr: buf.as_mut_ptr(),
            len: buf.len(),
        }
    }

    /// A pointer to element `start`, for a task that writes a strided part of
    /// `start..start + len` (checked to lie in the buffer). Creates no reference: what the
    /// task may write through it is the type's contract.
    pub fn span_ptr(&self, start: usize, len: usize) -> *mut T {
        assert!(start.checked_add(len).is_some_and(|end| end <= self.len));
        // SAFETY: in bounds (checked above).
        unsafe { self.ptr.add(start) }
    }

    /// # Safety
    /// No other live slice or write from this buffer may touch `start..start + len`.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice_mut(&self, start: usize, len: usize) -> &mut [T] {
        assert!(start.checked_add(len).is_some_and(|end| end <= self.len));
        // SAFETY: in bounds (checked above); exclusivity is the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), len) }
    }
}

/// Element-wise work smaller than this runs on the calling thread: a thread meeting costs a
/// few µs, which only a prefill's or a wide batch's rows repay.
const MIN_PARALLEL_ELEMENTS: usize = 16 * 1024;

/// Runs `f(first_row, rows)` over `data` (rows of `width` values) in chunks of whole rows:
/// spread over the pool when there is enough of it (a prefill's norms and activations would
/// otherwise leave every other core waiting), in one call on this thread otherwise (a decode
/// step of one or a few sequences).
pub fn for_row_chunks(data: &mut [f32], width: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    let rows = data.len() / width.max(1);
    if data.len() < MIN_PARALLEL_ELEMENTS || rows < 2 {
        return f(0, data);
    }
    // A few chunks per thread, so that a slow core does not hold the others back.
    let per_task = rows.div_ceil((super::pool::threads() * 4).min(rows));
    let shared = SharedSlice::new(data);
    super::pool::parallel_for(rows.div_ceil(per_task), |task| {
        let r0 = task * per_task;
        let r1 = (r0 + per_task).min(rows);
        // SAFETY: rows r0..r1 belong to this task alone.
        let chunk = unsafe { shared.slice_mut(r0 * width, (r1 - r0) * width) };
        f(r0, chunk);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_chunks_cover_every_row_once_with_its_index() {
        for (rows, width) in [(1, 8), (3, 7), (64, 512), (513, 64)] {
            let mut data = vec![0f32; rows * width];
            for_row_chunks(&mut data, width, |r0, chunk| {
                for (i, row) in chunk.chunks_exact_mut(width).enumerate() {
                    row.iter_mut().for_each(|v| *v += (r0 + i) as f32 + 1.0);
                }
            });
            for (r, row) in data.chunks_exact(width).enumerate() {
                assert!(
                    row.iter().all(|&v| v == r as f32 + 1.0),
                    "row {r} of {rows}"
                );
            }
        }
    }
}
