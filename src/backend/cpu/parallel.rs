//! Sharing one output buffer between worker threads that write disjoint parts of it.

/// A raw pointer the workers of one parallel loop write through.
///
/// SAFETY contract for users: every index written through `write` is written by exactly one
/// worker, and the buffer outlives the parallel loop (it is borrowed mutably around it).
#[derive(Clone, Copy)]
pub struct SharedOut {
    ptr: *mut f32,
    len: usize,
}

// SAFETY: only disjoint indices are written concurrently (see the type's contract).
unsafe impl Send for SharedOut {}
unsafe impl Sync for SharedOut {}

impl SharedOut {
    pub fn new(buf: &mut [f32]) -> Self {
        SharedOut {
            ptr: buf.as_mut_ptr(),
            len: buf.len(),
        }
    }

    #[inline]
    pub fn write(&self, i: usize, v: f32) {
        assert!(i < self.len);
        // SAFETY: in bounds (checked above); no other worker writes index i (type contract).
        unsafe { *self.ptr.add(i) = v };
    }
}
