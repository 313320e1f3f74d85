//! The device's ops for a vision encoder run whole (`vision::device` drives them, as
//! `vision::encoder` drives the CPU's): F16, BF16 and F32 matrices times f32 rows, layer and RMS
//! norms, GELU and SwiGLU, the halves-paired rotation from a host table, bidirectional attention
//! over an image's rows, and the heads' row moves. Buffers are device memory handed out as
//! [`DeviceRows`]; every op checks the spans it is given against the sizes its kernel reads and
//! writes, so that none of them can reach past a buffer.
// Each launch takes its kernel's argument list (see ops.rs).
#![allow(clippy::too_many_arguments)]

use super::device::CudaDevice;
use super::mem::{download, upload, DeviceBuf};
use super::ops::{self, cfg1, launch, norm_rows, Addr, Float, Int, Long, Ptr, THREADS};
use crate::quant::GgmlType;
use cudarc::driver::{CudaContext, CudaFunction, CudaStream, LaunchConfig};
use std::marker::PhantomData;
use std::ops::Range;
use std::sync::Arc;

/// kernels/vit.cu VA_MAX_HD: the largest head `vit_attention` takes.
pub const VIT_MAX_HEAD_DIM: usize = 128;
/// kernels/vit.cu VA_QUERIES.
const VA_QUERIES: usize = 32;
/// kernels/dense.cu DM_TILE and DM_THREADS.
const DM_TILE: usize = 64;
const DM_THREADS: usize = 256;

/// The kernels an encoder launches, looked up once.
struct Functions {
    dense_matmul: CudaFunction,
    layernorm: CudaFunction,
    rmsnorm: CudaFunction,
    gelu: CudaFunction,
    silu_mul: CudaFunction,
    add_scaled: CudaFunction,
    add_bias: CudaFunction,
    rope: CudaFunction,
    vit_attention: CudaFunction,
    gather_rows: CudaFunction,
    pool_squares: CudaFunction,
}

/// An encoder's ops on one device stream of their own.
pub struct EncoderOps {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    f: Functions,
}

/// Device memory holding `len` 4-byte values (f32 rows, or i32 indices).
pub struct DeviceRows {
    buf: DeviceBuf,
    len: usize,
}

/// A span of a [`DeviceRows`]: what the ops read and write.
#[derive(Clone, Copy)]
pub struct Rows<'a> {
    ptr: Ptr,
    len: usize,
    _of: PhantomData<&'a DeviceRows>,
}

/// Row numbers on the device (i32), none above `most`: a gather's rows or attention's spans.
pub struct DeviceIndex {
    rows: DeviceRows,
    most: usize,
}

/// A dense matrix on the device: `rows` rows of `cols` values of type `ty`, row-major.
pub struct DeviceMatrix {
    buf: DeviceBuf,
    ty: GgmlType,
    row_bytes: usize,
    pub rows: usize,
    pub cols: usize,
}

impl DeviceRows {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Values `offset..offset + len`.
    pub fn at(&self, offset: usize, len: usize) -> Rows<'_> {
        assert!(
            offset + len <= self.len,
            "{offset}+{len} past {} values",
            self.len
        );
        Rows {
            ptr: self.buf.ptr() + (offset * 4) as u64,
            len,
            _of: PhantomData,
        }
    }

    /// The first `len` values.
    pub fn first(&self, len: usize) -> Rows<'_> {
        self.at(0, len)
    }
}

impl<'a> Rows<'a> {
    pub fn len(&self) -> usize {
        self.len
    }

    /// The first `len` values.
    pub fn first(self, len: usize) -> Rows<'a> {
        assert!(len <= self.len, "{len} of {} values", self.len);
        Rows { len, ..self }
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Refuses a span shorter than an op needs.
fn need(what: &str, rows: Rows<'_>, len: usize) -> Result<(), String> {
    match rows.len >= len {
        true => Ok(()),
        false => Err(format!("{what}: {len} values needed, {} given", rows.len)),
    }
}

impl EncoderOps {
    pub fn new(dev: &CudaDevice) -> Result<EncoderOps, String> {
        let get = |name: &str| {
            dev.function(name)
                .cloned()
                .ok_or_else(|| format!("kernel {name} is not loaded"))
        };
        let f = Functions {
            dense_matmul: get("dense_matmul")?,
            layernorm: get("layernorm")?,
            rmsnorm: get("rmsnorm")?,
            gelu: get("gelu")?,
            silu_mul: get("silu_mul")?,
            add_scaled: get("add_scaled")?,
            add_bias: get("add_bias")?,
            rope: get("rope")?,
            vit_attention: get("vit_attention")?,
            gather_rows: get("gather_rows")?,
            pool_squares: get("pool_squares")?,
        };
        dev.ctx
            .bind_to_thread()
            .map_err(|e| format!("cannot use the CUDA context: {e:?}"))?;
        let stream =
            (dev.ctx.new_stream()).map_err(|e| format!("cannot create a stream: {e:?}"))?;
        Ok(EncoderOps {
            ctx: dev.ctx.clone(),
            stream,
            f,
        })
    }

    /// Makes the device's context this thread's (an encoder may run on any thread).
    pub fn bind(&self) -> Result<(), String> {
        (self.ctx.bind_to_thread()).map_err(|e| format!("cannot use the CUDA context: {e:?}"))
    }

    /// `len` zeroed values.
    pub fn zeros(&self, len: usize) -> Result<DeviceRows, String> {
        Ok(DeviceRows {
            buf: DeviceBuf::zeroed(&self.ctx, len * 4)?,
            len,
        })
    }

    /// A device copy of `values` (f32 or i32).
    pub fn copy_of<T: Copy>(&self, values: &[T]) -> Result<DeviceRows, String> {
        assert_eq!(std::mem::size_of::<T>(), 4, "4-byte values");
        Ok(DeviceRows {
            buf: DeviceBuf::from_host(&self.ctx, values)?,
            len: values.len(),
        })
    }

    /// A device copy of `rows` (row numbers, for [`EncoderOps::gather`] and the spans of
    /// [`EncoderOps::attention`]).
    pub fn index(&self, rows: &[usize]) -> Result<DeviceIndex, String> {
        let most = rows.iter().copied().max().unwrap_or(0);
        let values: Vec<i32> = (rows.iter())
            .map(|&r| i32::try_from(r).map_err(|_| format!("row {r} past i32")))
            .collect::<Result<_, _>>()?;
        Ok(DeviceIndex {
            rows: self.copy_of(&values)?,
            most,
        })
    }

    /// A row-major matrix as the file stores it, if its type is one the dense kernel reads.
    pub fn matrix(
        &self,
        ty: GgmlType,
        bytes: &[u8],
        rows: usize,
        cols: usize,
    ) -> Result<DeviceMatrix, String> {
        if !matches!(ty, GgmlType::F16 | GgmlType::BF16 | GgmlType::F32) {
            return Err(format!(
                "the device encoder takes F16, BF16 or F32 matrices, not {ty}"
            ));
        }
        let row_bytes = ty.row_bytes(cols as u64).expect("a dense type") as usize;
        assert_eq!(
            bytes.len(),
            rows * row_bytes,
            "a {rows} × {cols} {ty} matrix"
        );
        Ok(DeviceMatrix {
            buf: DeviceBuf::from_host(&self.ctx, bytes)?,
            ty,
            row_bytes,
            rows,
            cols,
        })
    }

    /// Writes `values` at the start of `to`, in stream order.
    pub fn write<T: Copy>(&self, to: Rows<'_>, values: &[T]) -> Result<(), String> {
        assert_eq!(std::mem::size_of::<T>(), 4, "4-byte values");
        need("write", to, values.len())?;
        // SAFETY: `to` holds at least values.len() 4-byte values.
        unsafe { upload(self.stream.cu_stream(), to.ptr, values) }
    }

    /// `from`'s values, once everything queued before has run.
    pub fn read(&self, from: Rows<'_>) -> Result<Vec<f32>, String> {
        let mut out = vec![0f32; from.len];
        // SAFETY: `from` holds `len` values.
        unsafe { download(self.stream.cu_stream(), &mut out, from.ptr) }?;
        Ok(out)
    }

    /// `out` (n rows of `band.len()`) = x (n rows of `m.cols`) times the rows `band` of `m`,
    /// plus `bias` (one value per row of the band) where given.
    pub fn linear(
        &self,
        m: &DeviceMatrix,
        band: Range<usize>,
        bias: Option<Rows<'_>>,
        x: Rows<'_>,
        out: Rows<'_>,
        n: usize,
    ) -> Result<(), String> {
        let rows = band.len();
        assert!(
            band.end <= m.rows,
            "rows {band:?} of a matrix of {}",
            m.rows
        );
        need("matrix input", x, n * m.cols)?;
        need("matrix output", out, n * rows)?;
        let w = m.buf.ptr() + (band.start * m.row_bytes) as u64;
        let cfg = LaunchConfig {
            grid_dim: (rows.div_ceil(DM_TILE) as u32, n.div_ceil(DM_TILE) as u32, 1),
            block_dim: (DM_THREADS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: dense_matmul(const u8 *w, int ty, const float *x, float *y, int rows,
        // int cols, int n_tok), the launch shape of kernels/dense.cu; the band lies within the
        // matrix, x and out were checked above.
        unsafe {
            launch(
                &self.stream,
                &self.f.dense_matmul,
                "dense_matmul",
                cfg,
                &[
                    Addr(w),
                    Int(m.ty.id() as i32),
                    Addr(x.ptr),
                    Addr(out.ptr),
                    Int(rows as i32),
                    Int(m.cols as i32),
                    Int(n as i32),
                ],
            )
        }?;
        match bias {
            Some(b) => {
                need("bias", b, rows)?;
                ops::add_bias(
                    &self.stream,
                    &self.f.add_bias,
                    out.ptr,
                    b.ptr,
                    n * rows,
                    rows,
                )
            }
            None => Ok(()),
        }
    }

    /// out = layernorm(x) · w + b, rows of `w.len()` (`out` may be `x`).
    pub fn layer_norm(
        &self,
        x: Rows<'_>,
        out: Rows<'_>,
        (w, b): (Rows<'_>, Rows<'_>),
        eps: f32,
    ) -> Result<(), String> {
        let (rows, n) = (x.len / w.len.max(1), w.len);
        need("norm output", out, x.len)?;
        need("norm bias", b, n)?;
        // SAFETY: layernorm(const float *x, const float *w, const float *b, float *out, int n,
        // float eps); one block of NORM_THREADS per row; every row checked above.
        unsafe {
            launch(
                &self.stream,
                &self.f.layernorm,
                "layernorm",
                norm_rows(rows),
                &[
                    Addr(x.ptr),
                    Addr(w.ptr),
                    Addr(b.ptr),
                    Addr(out.ptr),
                    Int(n as i32),
                    Float(eps),
                ],
            )
        }
    }

    /// out = rmsnorm(x) · w, rows of `w.len()` (`out` may be `x`).
    pub fn rms_norm(
        &self,
        x: Rows<'_>,
        out: Rows<'_>,
        w: Rows<'_>,
        eps: f32,
    ) -> Result<(), String> {
        need("norm output", out, x.len)?;
        let rows = x.len / w.len.max(1);
        ops::rmsnorm(
            &self.stream,
            &self.f.rmsnorm,
            x.ptr,
            w.ptr,
            out.ptr,
            rows,
            w.len,
            eps,
        )
    }

    /// x = gelu(x), ggml's looked-up GELU.
    pub fn gelu(&self, x: Rows<'_>) -> Result<(), String> {
        // SAFETY: gelu(float *x, long long n), one thread per value.
        unsafe {
            launch(
                &self.stream,
                &self.f.gelu,
                "gelu",
                cfg1(x.len, THREADS),
                &[Addr(x.ptr), Long(x.len as i64)],
            )
        }
    }

    /// gate = silu(gate) · up.
    pub fn silu_mul(&self, gate: Rows<'_>, up: Rows<'_>) -> Result<(), String> {
        need("gated input", up, gate.len)?;
        let f = (&self.f.silu_mul, "silu_mul");
        ops::glu(&self.stream, f, gate.ptr, up.ptr, gate.len)
    }

    /// x += y.
    pub fn add(&self, x: Rows<'_>, y: Rows<'_>) -> Result<(), String> {
        need("addend", y, x.len)?;
        ops::add_scaled(&self.stream, &self.f.add_scaled, x.ptr, y.ptr, 1.0, x.len)
    }

    /// Each head of `hd` of each row of x turned by its row's `hd / 2` (cos, sin) pairs of
    /// `turns`, dimension i with i + hd / 2.
    pub fn rotate_halves(&self, x: Rows<'_>, turns: Rows<'_>, hd: usize) -> Result<(), String> {
        let width = x.len / turns.len.max(1) * hd;
        let rows = x.len / width.max(1);
        need("rotary turns", turns, rows * hd)?;
        let shape = (rows, width / hd, hd);
        ops::rope(
            &self.stream,
            &self.f.rope,
            x.ptr,
            turns.ptr,
            shape,
            hd,
            true,
        )
    }

    /// out = each head's softmax(q·kᵀ / √hd)·v, each query row over the key rows of its span
    /// (`spans`: per row, its first key row and one past its last, none empty, non-decreasing
    /// along the rows).
    pub fn attention(
        &self,
        (q, k, v): (Rows<'_>, Rows<'_>, Rows<'_>),
        out: Rows<'_>,
        spans: &DeviceIndex,
        (heads, hd): (usize, usize),
    ) -> Result<(), String> {
        if hd > VIT_MAX_HEAD_DIM {
            return Err(format!(
                "heads of {hd} (the device's attention takes at most {VIT_MAX_HEAD_DIM})"
            ));
        }
        let n = q.len / (heads * hd);
        for (what, rows) in [("keys", k), ("values", v), ("attention output", out)] {
            need(what, rows, n * heads * hd)?;
        }
        if spans.rows.len != 2 * n || spans.most > n {
            return Err(format!(
                "{} span ends up to {} for {n} rows",
                spans.rows.len, spans.most
            ));
        }
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(VA_QUERIES) as u32, heads as u32, 1),
            block_dim: (VA_QUERIES as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: vit_attention(const float *q, const float *k, const float *v, float *out,
        // const int *spans, int n, int heads, int hd), kernels/vit.cu's launch shape; sizes
        // checked above.
        unsafe {
            launch(
                &self.stream,
                &self.f.vit_attention,
                "vit_attention",
                cfg,
                &[
                    Addr(q.ptr),
                    Addr(k.ptr),
                    Addr(v.ptr),
                    Addr(out.ptr),
                    Addr(spans.rows.buf.ptr()),
                    Int(n as i32),
                    Int(heads as i32),
                    Int(hd as i32),
                ],
            )
        }
    }

    /// dst row r = src row index[r], rows of `width`.
    pub fn gather(
        &self,
        dst: Rows<'_>,
        src: Rows<'_>,
        index: &DeviceIndex,
        width: usize,
    ) -> Result<(), String> {
        let rows = index.rows.len;
        need("gathered rows", dst, rows * width)?;
        need("rows gathered from", src, (index.most + 1) * width)?;
        // SAFETY: gather_rows(float *dst, const float *src, const int *index, int rows,
        // int width); one thread per value; every index and size checked above.
        unsafe {
            launch(
                &self.stream,
                &self.f.gather_rows,
                "gather_rows",
                cfg1(rows * width, THREADS),
                &[
                    Addr(dst.ptr),
                    Addr(src.ptr),
                    Addr(index.rows.buf.ptr()),
                    Int(rows as i32),
                    Int(width as i32),
                ],
            )
        }
    }

    /// dst = each `k` × `k` square of src (a `side` × `side` grid of rows of `width`) averaged.
    pub fn pool(
        &self,
        dst: Rows<'_>,
        src: Rows<'_>,
        (side, k): (usize, usize),
        width: usize,
    ) -> Result<(), String> {
        let out = (side / k) * (side / k) * width;
        need("pooled rows", dst, out)?;
        need("rows to pool", src, side * side * width)?;
        // SAFETY: pool_squares(float *dst, const float *src, int side, int k, int width); one
        // thread per value of dst; both sizes checked above.
        unsafe {
            launch(
                &self.stream,
                &self.f.pool_squares,
                "pool_squares",
                cfg1(out, THREADS),
                &[
                    Addr(dst.ptr),
                    Addr(src.ptr),
                    Int(side as i32),
                    Int(k as i32),
                    Int(width as i32),
                ],
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launch_shapes_match_the_kernel_sources() {
        let file = |name| {
            (super::super::kernels::FILES.iter())
                .find(|f| f.name == name)
                .unwrap()
                .body
        };
        let (dense, vit) = (file("dense"), file("vit"));
        assert!(dense.contains(&format!("#define DM_TILE {DM_TILE}\n")));
        assert!(dense.contains(&format!("#define DM_THREADS {DM_THREADS}\n")));
        assert!(vit.contains(&format!("#define VA_QUERIES {VA_QUERIES}\n")));
        assert!(vit.contains(&format!("#define VA_MAX_HD {VIT_MAX_HEAD_DIM}\n")));
    }
}
