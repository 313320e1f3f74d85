//! Dense GEMM for the vision encoder: `out[m][c] = Σ_i x[m][i] · w[c][i]` in f32, where `w`
//! is F16 or F32. A projector's ViT multiplies hundreds to thousands of patch rows by each
//! matrix, so, unlike the text model's per-token dots, it pays to tile: the matrix is repacked
//! once into panels of [`PANEL`] output columns laid out depth-major (`[panel][i][32]`, its own
//! type kept, so F16 stays half the size), and a register tile of rows × 32 columns
//! accumulates one outer product per depth step, every weight converted to f32 in a register
//! (F16C on x86) and reused by all the tile's rows.
//!
//! Activations stay f32 (the peer rounds them to f16 first), and each output is one FMA chain
//! over the depth in order, so the result is at least as close to the exact product as the
//! peer's.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

use super::parallel::SharedSlice;
use super::pool;
use crate::quant::GgmlType;
use half::f16;
use std::cell::Cell;

/// Output columns per panel: two AVX-512 registers, four AVX2 ones.
pub const PANEL: usize = 32;

/// Multiply-adds below which [`DenseMatrix::matmul`] stays on the calling thread: a few µs of
/// work, about what waking the pool costs.
const SERIAL_WORK: usize = 64 * 1024;

/// One panel's weights: `depth` steps of [`PANEL`] values, `stride` values apart.
#[derive(Clone, Copy)]
pub enum PanelRef<'a> {
    F16 { bits: &'a [u16], stride: usize },
    F32 { values: &'a [f32], stride: usize },
}

impl<'a> PanelRef<'a> {
    /// The panel's memory.
    fn bytes(self) -> &'a [u8] {
        // SAFETY: f32 and u16 have no padding; the bytes cover the same memory.
        unsafe {
            match self {
                PanelRef::F16 { bits, .. } => {
                    std::slice::from_raw_parts(bits.as_ptr().cast(), bits.len() * 2)
                }
                PanelRef::F32 { values, .. } => {
                    std::slice::from_raw_parts(values.as_ptr().cast(), values.len() * 4)
                }
            }
        }
    }

    fn check(&self, depth: usize) {
        let (len, stride) = match self {
            PanelRef::F16 { bits, stride } => (bits.len(), *stride),
            PanelRef::F32 { values, stride } => (values.len(), *stride),
        };
        assert!(stride >= PANEL && (depth == 0 || len >= (depth - 1) * stride + PANEL));
    }
}

enum Panels {
    F16(Vec<u16>),
    F32(Vec<f32>),
}

/// A weight matrix of `outputs` rows, each `depth` long, repacked into panels.
pub struct DenseMatrix {
    panels: Panels,
    pub outputs: usize,
    pub depth: usize,
}

impl DenseMatrix {
    /// Repacks a row-major F16, BF16 or F32 matrix as the file stores it; `None` for other types
    /// (quantized matrices go through the quantized matmul).
    pub fn pack(ty: GgmlType, bytes: &[u8], outputs: usize, depth: usize) -> Option<DenseMatrix> {
        let n_panels = outputs.div_ceil(PANEL);
        let at = |r: usize, i: usize, size: usize| &bytes[(r * depth + i) * size..][..size];
        let panels = match ty {
            GgmlType::F16 => {
                assert!(bytes.len() >= outputs * depth * 2);
                let mut v = vec![0u16; n_panels * depth * PANEL];
                for (r, i) in (0..outputs).flat_map(|r| (0..depth).map(move |i| (r, i))) {
                    let (p, j) = (r / PANEL, r % PANEL);
                    v[(p * depth + i) * PANEL + j] =
                        u16::from_le_bytes(at(r, i, 2).try_into().expect("2 bytes"));
                }
                Panels::F16(v)
            }
            // BF16 widens to F32 exactly (its bits are F32's top half).
            GgmlType::F32 | GgmlType::BF16 => {
                let size = if ty == GgmlType::F32 { 4 } else { 2 };
                assert!(bytes.len() >= outputs * depth * size);
                let value = |b: &[u8]| match b {
                    [a, b, c, d] => f32::from_le_bytes([*a, *b, *c, *d]),
                    [a, b] => f32::from_le_bytes([0, 0, *a, *b]),
                    _ => unreachable!("2 or 4 bytes"),
                };
                let mut v = vec![0f32; n_panels * depth * PANEL];
                for (r, i) in (0..outputs).flat_map(|r| (0..depth).map(move |i| (r, i))) {
                    let (p, j) = (r / PANEL, r % PANEL);
                    v[(p * depth + i) * PANEL + j] = value(at(r, i, size));
                }
                Panels::F32(v)
            }
            _ => return None,
        };
        Some(DenseMatrix {
            panels,
            outputs,
            depth,
        })
    }

    /// Bytes the panels take in memory.
    pub fn bytes(&self) -> usize {
        match &self.panels {
            Panels::F16(v) => v.len() * 2,
            Panels::F32(v) => v.len() * 4,
        }
    }

    fn panel(&self, p: usize) -> PanelRef<'_> {
        let len = self.depth * PANEL;
        match &self.panels {
            Panels::F16(v) => PanelRef::F16 {
                bits: &v[p * len..][..len],
                stride: PANEL,
            },
            Panels::F32(v) => PanelRef::F32 {
                values: &v[p * len..][..len],
                stride: PANEL,
            },
        }
    }

    /// `out[m][c] = Σ_i x[m][i] · w[c][i]` for every row of `x` (rows of `depth`), `out`
    /// rows of `outputs`, spread over the pool by (panel, run of rows).
    pub fn matmul(&self, x: &[f32], out: &mut [f32]) {
        let rows = x.len() / self.depth;
        assert!(x.len() == rows * self.depth && out.len() == rows * self.outputs);
        let n_panels = self.outputs.div_ceil(PANEL);
        // A product smaller than a thread meeting repays (a LoRA update of a few decode rows)
        // runs on this thread.
        let work = rows * self.outputs * self.depth;
        let tasks_wanted = if work < SERIAL_WORK {
            1
        } else {
            pool::threads() * 4
        };
        // Runs of rows long enough to amortise a task, enough tasks to balance the threads;
        // a task takes a few panels in turn, so that it can fetch the next while it
        // multiplies by this one (a matrix is read from memory once per call).
        let run = rows.div_ceil(tasks_wanted.div_ceil(n_panels)).clamp(1, 384);
        let runs = rows.div_ceil(run);
        let group = n_panels.div_ceil((tasks_wanted / runs).max(1));
        let groups = n_panels.div_ceil(group);
        let shared = SharedSlice::new(out);
        pool::parallel_for(groups * runs, |task| {
            let (g, r0) = (task % groups, (task / groups) * run);
            let r1 = (r0 + run).min(rows);
            let at = shared.span_ptr(r0 * self.outputs, (r1 - r0) * self.outputs);
            let panels = g * group..((g + 1) * group).min(n_panels);
            let mut wide = WIDE.take();
            for p in panels.clone() {
                let c0 = p * PANEL;
                let cols = (self.outputs - c0).min(PANEL);
                let next = (p + 1 < panels.end).then(|| self.panel(p + 1));
                let panel = widened(self.panel(p), &mut wide);
                // SAFETY: this task alone writes rows r0..r1's columns c0..c0 + cols.
                unsafe {
                    panel_product(
                        &x[r0 * self.depth..r1 * self.depth],
                        self.depth,
                        self.depth,
                        panel,
                        at.add(c0),
                        self.outputs,
                        cols,
                        next,
                    )
                };
            }
            WIDE.set(wide);
        });
    }
}

thread_local! {
    /// A task's F16 panel widened to f32 ([`widened`]), kept per thread.
    static WIDE: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// `panel` as the kernel this CPU runs multiplies it fastest: an F16 panel widened to f32 in
/// `wide` once for all of a task's rows instead of once per register tile (the portable loop
/// converts a value at a time), except on AVX-512, whose tile converts a step's weights for
/// twelve rows at no cost measured. Widening is exact: the products are the same bits.
fn widened<'a>(panel: PanelRef<'a>, wide: &'a mut Vec<f32>) -> PanelRef<'a> {
    let PanelRef::F16 { bits, stride } = panel else {
        return panel;
    };
    #[cfg(target_arch = "x86_64")]
    if crate::cpu_features::avx512() {
        return panel;
    }
    use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
    wide.resize(bits.len(), 0.0);
    bits.reinterpret_cast::<f16>().convert_to_f32_slice(wide);
    PanelRef::F32 {
        values: wide,
        stride,
    }
}

/// `out[m][c] = Σ_i x[m·lda + i] · panel(i, c)` for the rows of `x` and the first `cols`
/// columns of one panel, on the calling thread; `next` (the panel the caller multiplies by
/// next, if any) fetched into the cache a slice per register tile meanwhile.
///
/// # Safety
/// `out` points at row 0, column 0 of a buffer where every row `m` of `x` may write `cols`
/// values at `out + m·ldc`, which nothing else touches meanwhile.
#[allow(clippy::too_many_arguments)]
pub unsafe fn panel_product(
    x: &[f32],
    lda: usize,
    depth: usize,
    panel: PanelRef<'_>,
    out: *mut f32,
    ldc: usize,
    cols: usize,
    next: Option<PanelRef<'_>>,
) {
    assert!(cols <= PANEL && depth <= lda);
    panel.check(depth);
    let rows = if x.is_empty() {
        0
    } else {
        (x.len() - depth) / lda + 1
    };
    let next = next.map(PanelRef::bytes).unwrap_or_default();
    // The share of `next` fetched once the first `m` rows are done: as much as they are of
    // the rows.
    let ahead = |m: usize| next.len() * m / rows;
    let mut m = 0;
    while m < rows {
        let from = ahead(m);
        // SAFETY: `x` from row m holds the rows the kernel reads (it checks), the panel holds
        // `depth` steps (checked above), the output rows are this caller's.
        m += unsafe {
            kernel(
                &x[m * lda..],
                lda,
                depth,
                panel,
                out.add(m * ldc),
                ldc,
                cols,
                rows - m,
            )
        };
        fetch(&next[from..ahead(m)]);
    }
}

/// Writes `out[r·ldc + c]` for the first `rows ≤ rows_left` rows of `x` (the fastest
/// kernel this CPU runs takes as many as its registers hold) and `c < cols`; returns `rows`.
///
/// # Safety
/// As [`panel_product`]'s, for those rows.
#[allow(clippy::too_many_arguments)]
unsafe fn kernel(
    x: &[f32],
    lda: usize,
    depth: usize,
    panel: PanelRef<'_>,
    out: *mut f32,
    ldc: usize,
    cols: usize,
    rows_left: usize,
) -> usize {
    let checked = |rows: usize| {
        assert!(x.len() >= (rows - 1) * lda + depth);
        rows
    };
    #[cfg(target_arch = "x86_64")]
    {
        if crate::cpu_features::avx512() {
            let rows = checked(rows_left.min(avx512::ROWS));
            // SAFETY: AVX-512 and F16C detected; `x` holds the rows, the panel `depth` steps,
            // the output is the caller's.
            unsafe { avx512::tile(x.as_ptr(), lda, depth, panel, out, ldc, cols, rows) };
            return rows;
        }
        if crate::cpu_features::avx2() {
            let rows = checked(rows_left.min(avx2::ROWS));
            // SAFETY: AVX2, FMA and F16C detected; as above.
            unsafe { avx2::tile(x.as_ptr(), lda, depth, panel, out, ldc, cols, rows) };
            return rows;
        }
    }
    let rows = checked(rows_left.min(PORTABLE_ROWS));
    let mut tile = [[0f32; PANEL]; PORTABLE_ROWS];
    portable_tile(x, lda, depth, panel, &mut tile[..rows]);
    for (r, row) in tile[..rows].iter().enumerate() {
        // SAFETY: the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(row.as_ptr(), out.add(r * ldc), cols) };
    }
    rows
}

const PORTABLE_ROWS: usize = 4;

/// Asks for `bytes` in the cache ahead of their use (a hint; nothing where the CPU has none).
fn fetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for line in bytes.chunks(64) {
        // SAFETY: a prefetch reads nothing and cannot fault.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(
                line.as_ptr().cast(),
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// The reference every kernel matches: per output, one FMA chain over the depth in order.
fn portable_tile(
    x: &[f32],
    lda: usize,
    depth: usize,
    panel: PanelRef<'_>,
    tile: &mut [[f32; PANEL]],
) {
    for row in tile.iter_mut() {
        row.fill(0.0);
    }
    for i in 0..depth {
        let mut w = [0f32; PANEL];
        match panel {
            PanelRef::F16 { bits, stride } => w
                .iter_mut()
                .zip(&bits[i * stride..][..PANEL])
                .for_each(|(w, &b)| *w = f16::from_bits(b).to_f32()),
            PanelRef::F32 { values, stride } => w.copy_from_slice(&values[i * stride..][..PANEL]),
        }
        for (r, row) in tile.iter_mut().enumerate() {
            let a = x[r * lda + i];
            row.iter_mut()
                .zip(&w)
                .for_each(|(o, &w)| *o = a.mul_add(w, *o));
        }
    }
}

/// Values in the panels of a product with `outputs` columns over `depth`.
pub fn packed_len(outputs: usize, depth: usize) -> usize {
    outputs.div_ceil(PANEL) * depth * PANEL
}

/// Packs `rows` rows of f32 (each `depth` long, `stride` apart) as the panels of their
/// transpose's product: `panels[p][i][j] = src[(p·32 + j)·stride + i]`, zeros past `rows`
/// (`panels` is [`packed_len`]`(rows, depth)` long). Attention's keys, packed per head so
/// that scores are a panel product.
pub fn pack_rows_f32(src: &[f32], stride: usize, rows: usize, depth: usize, panels: &mut [f32]) {
    assert_eq!(panels.len(), packed_len(rows, depth));
    panels[(rows / PANEL) * depth * PANEL..].fill(0.0);
    for r in 0..rows {
        let (p, j) = (r / PANEL, r % PANEL);
        let row = &src[r * stride..][..depth];
        for (i, &v) in row.iter().enumerate() {
            panels[(p * depth + i) * PANEL + j] = v;
        }
    }
}

/// Packs `depth` rows of f32 (`stride` apart) whose first `cols` values are the product's
/// columns: `panels[p][i][j] = src[i·stride + p·32 + j]`, zeros past `cols` (`panels` is
/// [`packed_len`]`(cols, depth)` long). Attention's values, packed per head so that outputs
/// are a panel product.
pub fn pack_columns_f32(src: &[f32], stride: usize, depth: usize, cols: usize, panels: &mut [f32]) {
    assert_eq!(panels.len(), packed_len(cols, depth));
    let n_panels = cols.div_ceil(PANEL);
    panels[(cols / PANEL) * depth * PANEL..].fill(0.0);
    for p in 0..n_panels {
        let width = (cols - p * PANEL).min(PANEL);
        for i in 0..depth {
            panels[(p * depth + i) * PANEL..][..width]
                .copy_from_slice(&src[i * stride + p * PANEL..][..width]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each output as one FMA chain over the depth in order.
    fn naive(x: &[f32], w: &[f32], depth: usize) -> Vec<f32> {
        x.chunks_exact(depth)
            .flat_map(|xr| {
                w.chunks_exact(depth).map(move |wr| {
                    xr.iter()
                        .zip(wr)
                        .fold(0f32, |acc, (&a, &b)| a.mul_add(b, acc))
                })
            })
            .collect()
    }

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let h = (i as u32 ^ seed).wrapping_mul(2_654_435_761) >> 8;
                (h % 2001) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn every_kernel_matches_the_in_order_chain_for_f16_and_f32_weights() {
        // Ragged shapes: a partial panel, rows that are not a multiple of any tile.
        for (rows, outputs, depth) in [(1, 5, 3), (13, 33, 17), (29, 70, 64), (50, 32, 1)] {
            let x = values(rows * depth, 7);
            let w16: Vec<f16> = values(outputs * depth, 9)
                .into_iter()
                .map(f16::from_f32)
                .collect();
            let w32: Vec<f32> = w16.iter().map(|v| v.to_f32()).collect();
            let want = naive(&x, &w32, depth);
            let bytes16: Vec<u8> = w16.iter().flat_map(|v| v.to_le_bytes()).collect();
            let bytes32: Vec<u8> = w32.iter().flat_map(|v| v.to_le_bytes()).collect();
            for (ty, bytes) in [(GgmlType::F16, &bytes16), (GgmlType::F32, &bytes32)] {
                let m = DenseMatrix::pack(ty, bytes, outputs, depth).expect("dense type");
                let mut out = vec![f32::NAN; rows * outputs];
                m.matmul(&x, &mut out);
                assert_eq!(out, want, "{ty:?} {rows}×{outputs}×{depth}");
                let mut tile = [[0f32; PANEL]; PORTABLE_ROWS];
                let take = rows.min(PORTABLE_ROWS);
                portable_tile(&x, depth, depth, m.panel(0), &mut tile[..take]);
                for r in 0..take {
                    let n = outputs.min(PANEL);
                    assert_eq!(&tile[r][..n], &want[r * outputs..][..n]);
                }
            }
        }
    }

    /// Every kernel this machine has, whatever `EDGELM_SIMD` says, against the portable one,
    /// on a partial panel of each type.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_x86_kernels_match_the_portable_one_bit_for_bit() {
        type Tile =
            unsafe fn(*const f32, usize, usize, PanelRef<'_>, *mut f32, usize, usize, usize);
        let hw = crate::cpu_features::hardware();
        let kernels: [(&str, bool, usize, Tile); 2] = [
            ("avx512", hw.avx512_vnni, avx512::ROWS, avx512::tile),
            ("avx2", hw.avx2, avx2::ROWS, avx2::tile),
        ];
        let (outputs, depth) = (27, 19);
        let x = values(12 * depth, 4);
        let w16: Vec<u8> = values(outputs * depth, 6)
            .into_iter()
            .flat_map(|v| f16::from_f32(v).to_le_bytes())
            .collect();
        let w32: Vec<u8> = values(outputs * depth, 8)
            .into_iter()
            .flat_map(f32::to_le_bytes)
            .collect();
        for (ty, bytes) in [(GgmlType::F16, &w16), (GgmlType::F32, &w32)] {
            let m = DenseMatrix::pack(ty, bytes, outputs, depth).expect("dense type");
            for rows in 1..=12 {
                let mut want = vec![0f32; rows * outputs];
                for r0 in (0..rows).step_by(PORTABLE_ROWS) {
                    let take = (rows - r0).min(PORTABLE_ROWS);
                    let mut tile = [[0f32; PANEL]; PORTABLE_ROWS];
                    portable_tile(
                        &x[r0 * depth..],
                        depth,
                        depth,
                        m.panel(0),
                        &mut tile[..take],
                    );
                    for r in 0..take {
                        want[(r0 + r) * outputs..][..outputs].copy_from_slice(&tile[r][..outputs]);
                    }
                }
                let run = |name: &str, f: &dyn Fn(*mut f32)| {
                    let mut got = vec![f32::NAN; rows * outputs];
                    f(got.as_mut_ptr());
                    assert_eq!(got, want, "{name} {ty:?} {rows} rows");
                };
                for (name, has, most, tile) in kernels {
                    if has && rows <= most {
                        // SAFETY: detected; `x` holds 12 rows; each output row has `outputs`.
                        run(name, &|out| unsafe {
                            tile(
                                x.as_ptr(),
                                depth,
                                depth,
                                m.panel(0),
                                out,
                                outputs,
                                outputs,
                                rows,
                            )
                        });
                    }
                }
            }
        }
    }

    #[test]
    fn packed_rows_give_the_transposed_product() {
        let (rows, depth) = (40, 9);
        let k = values(rows * 12, 3);
        let mut panels = vec![f32::NAN; packed_len(rows, depth)];
        pack_rows_f32(&k, 12, rows, depth, &mut panels);
        let q = values(3 * depth, 5);
        let mut out = vec![0f32; 3 * rows];
        for p in 0..rows.div_ceil(PANEL) {
            let panel = PanelRef::F32 {
                values: &panels[p * depth * PANEL..][..depth * PANEL],
                stride: PANEL,
            };
            let cols = (rows - p * PANEL).min(PANEL);
            // SAFETY: each row of `out` has `rows` columns, this panel's slice is its own.
            unsafe {
                panel_product(
                    &q,
                    depth,
                    depth,
                    panel,
                    out.as_mut_ptr().add(p * PANEL),
                    rows,
                    cols,
                    None,
                )
            };
        }
        let kt: Vec<f32> = (0..rows)
            .flat_map(|r| k[r * 12..][..depth].to_vec())
            .collect();
        assert_eq!(out, naive(&q, &kt, depth));
    }

    #[test]
    fn quantized_types_are_not_dense() {
        assert!(DenseMatrix::pack(GgmlType::Q8_0, &[0; 34], 1, 32).is_none());
    }
}
