//! This machine's own ceilings, for `edgelm bench` to report achieved throughput against:
//! a tight FMA loop (peak arithmetic), a STREAM-like copy and a read-only sweep (peak memory
//! bandwidth), all on the compute pool's threads.

use super::parallel::SharedSlice;
use super::pool;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::Instant;

/// Peak f32 GFLOP/s of the pool's threads: independent FMA chains, enough to cover latency.
pub fn peak_gflops() -> f64 {
    const ITERS: usize = 4_000_000;
    let threads = pool::threads();
    let mut best = 0f64;
    for _ in 0..3 {
        let flops = AtomicUsize::new(0);
        let t0 = Instant::now();
        pool::parallel_for(threads, |_| {
            let (flops_per_iter, v) = fma_loop(ITERS);
            std::hint::black_box(v);
            flops.fetch_add(ITERS * flops_per_iter, Relaxed);
        });
        let secs = t0.elapsed().as_secs_f64();
        best = best.max(flops.into_inner() as f64 / secs / 1e9);
    }
    best
}

/// Returns (flops per iteration, a value depending on every FMA so none is optimised out).
fn fma_loop(iters: usize) -> (usize, f32) {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu_features::avx2() {
        // SAFETY: the CPU has AVX2 and FMA (checked above).
        return unsafe { x86::fma_loop(iters) };
    }
    let mut acc = [1.0f32; 32];
    for _ in 0..iters {
        for a in acc.iter_mut() {
            *a = a.mul_add(0.999_999, 1e-7);
        }
    }
    (64, std::hint::black_box(acc).iter().sum())
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// 12 independent 8-lane chains: two FMA pipes × four cycles of latency, with margin.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn fma_loop(iters: usize) -> (usize, f32) {
        let m = _mm256_set1_ps(0.999_999);
        let c = _mm256_set1_ps(1e-7);
        let mut acc = [_mm256_set1_ps(1.0); 12];
        for _ in 0..iters {
            for a in acc.iter_mut() {
                *a = _mm256_fmadd_ps(*a, m, c);
            }
        }
        let mut out = [0f32; 8];
        let mut s = _mm256_setzero_ps();
        for a in acc {
            s = _mm256_add_ps(s, a);
        }
        // SAFETY: `out` holds 8 f32.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), s) };
        (12 * 8 * 2, out.iter().sum())
    }
}

/// Bytes of the buffers the bandwidth sweeps run over: far larger than any cache.
const SWEEP_BYTES: usize = 256 << 20;

/// The best GB/s of a few sweeps: each runs `sweep(a..b)` over every task's share of
/// `SWEEP_BYTES / 4` f32 on the pool's threads and moves `bytes_per_sweep` bytes.
fn best_sweep_gbs(bytes_per_sweep: usize, sweep: impl Fn(std::ops::Range<usize>) + Sync) -> f64 {
    let n = SWEEP_BYTES / 4;
    let tasks = pool::threads() * 4;
    let chunk = n.div_ceil(tasks);
    let mut best = 0f64;
    for _ in 0..4 {
        let t0 = Instant::now();
        pool::parallel_for(tasks, |t| sweep(t * chunk..((t + 1) * chunk).min(n)));
        let secs = t0.elapsed().as_secs_f64();
        best = best.max(bytes_per_sweep as f64 / secs / 1e9);
    }
    best
}

/// Memory bandwidth in GB/s (bytes read + bytes written per second) of a copy between two
/// buffers far larger than the caches, split across the pool's threads; best of a few runs.
pub fn stream_copy_gbs() -> f64 {
    let n = SWEEP_BYTES / 4;
    let src: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let mut dst = vec![0f32; n];
    let out = SharedSlice::new(&mut dst);
    let gbs = best_sweep_gbs(2 * SWEEP_BYTES, |r| {
        // SAFETY: each task alone writes its range.
        unsafe { out.slice_mut(r.start, r.len()) }.copy_from_slice(&src[r]);
    });
    std::hint::black_box(&dst);
    gbs
}

/// Read bandwidth in GB/s: every thread sums its share of a buffer far larger than the caches
/// (decode streams its weights this way: reads only); best of a few runs.
pub fn stream_read_gbs() -> f64 {
    let src: Vec<f32> = (0..SWEEP_BYTES / 4).map(|i| (i % 1024) as f32).collect();
    best_sweep_gbs(SWEEP_BYTES, |r| {
        std::hint::black_box(sum_f32(&src[r]));
    })
}

/// A sum with enough independent lanes that the loads, not the adds, set the pace.
fn sum_f32(v: &[f32]) -> f32 {
    let mut acc = [0f32; 32];
    let mut chunks = v.chunks_exact(32);
    for c in &mut chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a += x;
        }
    }
    acc.iter().sum::<f32>() + chunks.remainder().iter().sum::<f32>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceilings_are_positive_and_finite() {
        let g = peak_gflops();
        let b = stream_copy_gbs();
        let r = stream_read_gbs();
        assert!(g.is_finite() && g > 0.1, "{g} GFLOP/s");
        assert!(b.is_finite() && b > 0.1, "{b} GB/s");
        assert!(r.is_finite() && r > 0.1, "{r} GB/s");
    }
}
