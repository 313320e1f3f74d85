//! Binding a GGUF's tensors by name: each taken at most once, checked for its shape and type,
//! small vectors dequantized into one arena, and a file with a tensor nothing took refused.

use crate::backend::ops::{Mat, VecRef};
use crate::gguf::GgufFile;
use crate::quant;
use anyhow::{bail, Context, Result};

/// Binds tensors by name and remembers which ones were taken.
pub(crate) struct Binder<'a> {
    pub(in crate::model) file: &'a GgufFile,
    pub(in crate::model) used: Vec<bool>,
    pub(in crate::model) arena: Vec<f32>,
}

impl<'a> Binder<'a> {
    pub(crate) fn new(file: &'a GgufFile) -> Self {
        Binder {
            file,
            used: vec![false; file.tensors().len()],
            arena: Vec::new(),
        }
    }

    /// The dims of tensor `name`, where the file has it.
    /// The file the tensors are bound from.
    pub(crate) fn file(&self) -> &'a GgufFile {
        self.file
    }

    pub(crate) fn dims(&self, name: &str) -> Option<&[u64]> {
        self.index(name).map(|i| &self.file.tensors()[i].dims[..])
    }

    pub(crate) fn index(&self, name: &str) -> Option<usize> {
        self.file.tensors().iter().position(|t| t.name == name)
    }

    /// A matrix of `rows` rows of `cols` values.
    pub(crate) fn mat(&mut self, name: &str, cols: usize, rows: usize) -> Result<Mat> {
        self.opt_mat(name, cols, rows)?
            .with_context(|| format!("model has no tensor '{name}'"))
    }

    pub(crate) fn opt_mat(&mut self, name: &str, cols: usize, rows: usize) -> Result<Option<Mat>> {
        if self.index(name).is_none() {
            return Ok(None);
        }
        self.flat_mat(name, &[cols as u64, rows as u64], cols, rows)
            .map(Some)
    }

    /// A tensor of exactly `dims` (ggml order; trailing 1s aside), of a type edgelm computes
    /// with, taken whole: its index into `GgufFile::tensors()`.
    pub(crate) fn tensor(&mut self, name: &str, dims: &[u64]) -> Result<usize> {
        let idx = self
            .index(name)
            .with_context(|| format!("model has no tensor '{name}'"))?;
        let info = &self.file.tensors()[idx];
        let got = &info.dims;
        let fits = got.len() >= dims.len()
            && got[..dims.len()] == *dims
            && got[dims.len()..].iter().all(|&d| d == 1);
        if !fits {
            bail!("tensor '{name}' has dims {got:?}, expected {dims:?}");
        }
        if !quant::is_supported(info.ty) {
            bail!(
                "tensor '{name}' has type {} which edgelm cannot compute with",
                info.ty
            );
        }
        self.used[idx] = true;
        Ok(idx)
    }

    /// A tensor of `dims` read as `rows` rows of `cols` values (a convolution's kernels, each
    /// flattened into one row).
    pub(crate) fn flat_mat(
        &mut self,
        name: &str,
        dims: &[u64],
        cols: usize,
        rows: usize,
    ) -> Result<Mat> {
        debug_assert_eq!(dims.iter().product::<u64>(), (cols * rows) as u64);
        let tensor = self.tensor(name, dims)?;
        Ok(Mat {
            name: name.to_owned(),
            ty: self.file.tensors()[tensor].ty,
            cols,
            rows,
            tensor,
            first_row: 0,
        })
    }

    /// A 3-D tensor of `n` experts' matrices, each `rows` rows of `cols` values, as one
    /// matrix per expert.
    pub(crate) fn experts(
        &mut self,
        name: &str,
        cols: usize,
        rows: usize,
        n: usize,
    ) -> Result<Vec<Mat>> {
        let idx = self
            .index(name)
            .with_context(|| format!("model has no tensor '{name}'"))?;
        let info = &self.file.tensors()[idx];
        let dims = &info.dims;
        let three_d = dims.len() >= 3 && dims[3..].iter().all(|&d| d == 1);
        if !three_d || dims[..3] != [cols as u64, rows as u64, n as u64] {
            bail!("tensor '{name}' has dims {dims:?}, expected [{cols}, {rows}, {n}] (one matrix per expert)");
        }
        if !quant::is_supported(info.ty) {
            bail!(
                "tensor '{name}' has type {} which edgelm cannot compute with",
                info.ty
            );
        }
        self.used[idx] = true;
        Ok((0..n)
            .map(|e| Mat {
                name: format!("{name}[{e}]"),
                ty: info.ty,
                cols,
                rows,
                tensor: idx,
                first_row: e * rows,
            })
            .collect())
    }

    /// A small 1-D tensor, dequantized into the arena.
    pub(crate) fn vector(&mut self, name: &str, len: usize) -> Result<VecRef> {
        self.opt_vector(name, len)?
            .with_context(|| format!("model has no tensor '{name}'"))
    }

    pub(crate) fn opt_vector(&mut self, name: &str, len: usize) -> Result<Option<VecRef>> {
        let Some(idx) = self.index(name) else {
            return Ok(None);
        };
        let info = &self.file.tensors()[idx];
        if info.n_elements() != len as u64 {
            bail!(
                "tensor '{name}' has {} values, expected {len}",
                info.n_elements()
            );
        }
        let offset = self.arena.len();
        self.arena.resize(offset + len, 0.0);
        quant::dequantize_row(
            info.ty,
            self.file.tensor_data(info),
            &mut self.arena[offset..],
        )
        .with_context(|| format!("tensor '{name}'"))?;
        self.used[idx] = true;
        Ok(Some(VecRef { offset, len }))
    }

    /// A tensor that only an optional feature may use: an error if it is there but not allowed.
    pub(crate) fn allowed(&self, name: &str, allowed: bool) -> Result<bool> {
        if !allowed && self.index(name).is_some() {
            bail!("tensor '{name}' is not used by this architecture");
        }
        Ok(allowed)
    }

    /// An optional vector that only an optional feature may use (see [`Binder::allowed`]).
    pub(crate) fn allowed_vector(
        &mut self,
        name: &str,
        allowed: bool,
        len: usize,
    ) -> Result<Option<VecRef>> {
        if self.allowed(name, allowed)? {
            self.opt_vector(name, len)
        } else {
            Ok(None)
        }
    }

    /// Fails on the first tensor nothing took.
    /// `what` names the file's kind in the message ("architecture 'llama'").
    pub(crate) fn finish(self, what: &str) -> Result<Vec<f32>> {
        let unused: Vec<&str> = self
            .file
            .tensors()
            .iter()
            .zip(&self.used)
            .filter(|(_, &u)| !u)
            .map(|(t, _)| t.name.as_str())
            .collect();
        if let Some(first) = unused.first() {
            bail!(
                "tensor '{first}' is not used by {what}{} (a model with parts \
                 edgelm would ignore is refused)",
                match unused.len() {
                    1 => String::new(),
                    n => format!(" ({} more unused)", n - 1),
                }
            );
        }
        Ok(self.arena)
    }
}
