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

    /// # Safety
    /// No other live slice or write from this buffer may touch `start..start + len`.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice_mut(&self, start: usize, len: usize) -> &mut [T] {
        assert!(start.checked_add(len).is_some_and(|end| end <= self.len));
        // SAFETY: in bounds (checked above); exclusivity is the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), len) }
    }
}
