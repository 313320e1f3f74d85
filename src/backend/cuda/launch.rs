//! How the matmul and sampling kernels are launched: their block shapes, mirrored from the
//! `#define`s at the top of `kernels/gemv.cu`, `kernels/gemm.cu` and `kernels/sample.cu` (a unit
//! test reads those back, so the two sides cannot drift apart), the grid each needs, and the
//! per-row parameters `sample_rows` reads.

use crate::backend::sampling::SamplingParams;
use crate::quant::GgmlType;
use cudarc::driver::LaunchConfig;

/// gemv.cu: one warp per weight row, this many rows per block.
pub const GEMV_WARPS: usize = 4;
/// gemv.cu: tokens one launch serves; more go to the GEMM.
pub const GEMV_MAX_TOK: usize = 8;
/// gemm.cu: weight rows per block (16 per warp).
pub const GEMM_BM: usize = 64;
/// gemm.cu: tokens per block.
pub const GEMM_BN: usize = 64;
/// gemm.cu: threads per block (GEMM_WARPS = 4 warps).
pub const GEMM_THREADS: usize = 128;
/// sample.cu: threads per row of `argmax_rows`.
pub const ARGMAX_THREADS: usize = 256;
/// sample.cu: threads per row of `sample_rows`.
pub const SAMPLE_THREADS: usize = 512;

fn config(grid: (usize, usize), block: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (grid.0 as u32, grid.1 as u32, 1),
        block_dim: (block as u32, 1, 1),
        // Every kernel here uses static shared memory only.
        shared_mem_bytes: 0,
    }
}

/// The weight types with a CUDA matmul (GEMV and GEMM).
pub const MATMUL_TYPES: [GgmlType; 6] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
];

/// The matmul kernel for `n_tok` tokens against weights of type `ty`: the GEMV (dp4a, weights
/// read once for all tokens) up to [`GEMV_MAX_TOK`] tokens, the tensor-core GEMM above.
/// `None` for weight types without a CUDA matmul.
pub fn matmul_kernel(ty: GgmlType, n_tok: usize) -> Option<&'static str> {
    use GgmlType::*;
    let gemv = n_tok <= GEMV_MAX_TOK;
    Some(match (ty, gemv) {
        (Q4_0, true) => "gemv_q4_0",
        (Q4_1, true) => "gemv_q4_1",
        (Q5_0, true) => "gemv_q5_0",
        (Q8_0, true) => "gemv_q8_0",
        (Q4_K, true) => "gemv_q4_k",
        (Q6_K, true) => "gemv_q6_k",
        (Q4_0, false) => "gemm_q4_0",
        (Q4_1, false) => "gemm_q4_1",
        (Q5_0, false) => "gemm_q5_0",
        (Q8_0, false) => "gemm_q8_0",
        (Q4_K, false) => "gemm_q4_k",
        (Q6_K, false) => "gemm_q6_k",
        _ => return None,
    })
}

/// The expert-matrix kernel (`moe_gemv_*` in gemv.cu) for experts of type `ty`; `None` for
/// types without one.
pub fn moe_gemv_kernel(ty: GgmlType) -> Option<&'static str> {
    use GgmlType::*;
    Some(match ty {
        Q4_0 => "moe_gemv_q4_0",
        Q4_1 => "moe_gemv_q4_1",
        Q5_0 => "moe_gemv_q5_0",
        Q8_0 => "moe_gemv_q8_0",
        Q4_K => "moe_gemv_q4_k",
        Q6_K => "moe_gemv_q6_k",
        MXFP4 => "moe_gemv_mxfp4",
        _ => return None,
    })
}

/// The most pairs (a token and one of its experts) one `moe_gemv_*` launch serves: its grid's
/// second dimension.
pub const MOE_MAX_PAIRS: usize = 65_535;

/// moe.cu: warps (one per token and expert) per block of `moe_router_f32`.
pub const ROUTER_WARPS: usize = 4;

/// `moe_gemv_*(w, expert_bytes, ids, act, act_div, y, rows, cols)` over `pairs` pairs.
pub fn moe_gemv_config(rows: usize, pairs: usize) -> LaunchConfig {
    config((rows.div_ceil(GEMV_WARPS), pairs), 32 * GEMV_WARPS)
}

/// `gemv_*(w, act, y, rows, cols, n_tok)` with 1 <= n_tok <= [`GEMV_MAX_TOK`].
pub fn gemv_config(rows: usize) -> LaunchConfig {
    config((rows.div_ceil(GEMV_WARPS), 1), 32 * GEMV_WARPS)
}

/// `gemm_*(w, act, y, rows, cols, n_tok)`: one block per [`GEMM_BM`] rows x [`GEMM_BN`] tokens.
pub fn gemm_config(rows: usize, n_tok: usize) -> LaunchConfig {
    config(
        (rows.div_ceil(GEMM_BM), n_tok.div_ceil(GEMM_BN)),
        GEMM_THREADS,
    )
}

/// `argmax_rows(logits, n, out)`: one block per row.
pub fn argmax_config(rows: usize) -> LaunchConfig {
    config((rows, 1), ARGMAX_THREADS)
}

/// `sample_rows(logits, n, params, out)`: one block per row.
pub fn sample_config(rows: usize) -> LaunchConfig {
    config((rows, 1), SAMPLE_THREADS)
}

/// One row's sampling parameters as `sample_rows` reads them (`struct SampleRow` in
/// kernels/sample.cu: 32 bytes, little-endian, in this field order).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SampleRow {
    /// <= 0: greedy.
    pub temperature: f32,
    /// >= 1: off.
    pub top_p: f32,
    /// 0: off.
    pub min_p: f32,
    /// 0: off.
    pub top_k: u32,
    pub seed: u64,
    /// Draws the request's sampler has made so far: the device takes draw `step` of
    /// `Rng::new(seed)`, the one the CPU sampler would take next.
    pub step: u64,
}

impl SampleRow {
    pub const BYTES: usize = 32;

    /// The device's parameters for a request, or `None` when it asks for repetition, presence
    /// or frequency penalties or a logit bias, which `sample_rows` does not apply.
    pub fn new(p: &SamplingParams, seed: u64, step: u64) -> Option<SampleRow> {
        if p.repetition_penalty != 1.0
            || p.presence_penalty != 0.0
            || p.frequency_penalty != 0.0
            || !p.logit_bias.is_empty()
        {
            return None;
        }
        Some(SampleRow {
            temperature: p.temperature,
            top_p: p.top_p,
            min_p: p.min_p,
            top_k: u32::try_from(p.top_k).unwrap_or(u32::MAX),
            seed,
            step,
        })
    }

    /// The bytes of `rows` for a device copy.
    pub fn encode(rows: &[SampleRow]) -> Vec<u8> {
        let mut out = Vec::with_capacity(rows.len() * Self::BYTES);
        for r in rows {
            out.extend_from_slice(&r.temperature.to_le_bytes());
            out.extend_from_slice(&r.top_p.to_le_bytes());
            out.extend_from_slice(&r.min_p.to_le_bytes());
            out.extend_from_slice(&r.top_k.to_le_bytes());
            out.extend_from_slice(&r.seed.to_le_bytes());
            out.extend_from_slice(&r.step.to_le_bytes());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::super::kernels::FILES;
    use super::*;

    /// The value of `#define NAME value` in kernels/{file}.cu.
    fn define(file: &str, name: &str) -> String {
        let body = FILES.iter().find(|f| f.name == file).unwrap().body;
        body.lines()
            .find_map(|l| {
                let mut w = l.split_whitespace();
                (w.next() == Some("#define") && w.next() == Some(name))
                    .then(|| w.next().unwrap().to_string())
            })
            .unwrap_or_else(|| panic!("no #define {name} in kernels/{file}.cu"))
    }

    #[test]
    fn constants_match_the_kernel_sources() {
        let num = |file: &str, name: &str| define(file, name).parse::<usize>().unwrap();
        assert_eq!(num("gemv", "GEMV_WARPS"), GEMV_WARPS);
        assert_eq!(num("gemv", "GEMV_MAX_TOK"), GEMV_MAX_TOK);
        assert_eq!(num("gemm", "GEMM_BM"), GEMM_BM);
        assert_eq!(num("gemm", "GEMM_BN"), GEMM_BN);
        assert_eq!(32 * num("gemm", "GEMM_WARPS"), GEMM_THREADS);
        assert_eq!(GEMM_BM, 16 * GEMM_THREADS / 32, "16 rows per warp");
        assert_eq!(num("sample", "ARGMAX_THREADS"), ARGMAX_THREADS);
        assert_eq!(num("sample", "SAMPLE_THREADS"), SAMPLE_THREADS);
        assert_eq!(num("moe", "ROUTER_WARPS"), ROUTER_WARPS);
        use super::super::weights::max_query_heads_per_kv_head as max_rep;
        assert_eq!(num("attention", "ATT_MAX_REP"), max_rep(128));
        assert_eq!(num("attention", "ATT_MAX_REP_D256"), max_rep(256));
    }

    #[test]
    fn grids_cover_every_row_and_token() {
        let c = gemm_config(100, 130);
        assert_eq!(c.grid_dim, (2, 3, 1));
        assert_eq!(c.block_dim, (128, 1, 1));
        assert_eq!(gemm_config(64, 64).grid_dim, (1, 1, 1));
        assert_eq!(gemv_config(37).grid_dim, (10, 1, 1));
        assert_eq!(sample_config(5).grid_dim, (5, 1, 1));
        assert_eq!(matmul_kernel(GgmlType::Q4_K, 8), Some("gemv_q4_k"));
        assert_eq!(matmul_kernel(GgmlType::Q4_K, 9), Some("gemm_q4_k"));
        assert_eq!(matmul_kernel(GgmlType::F16, 9), None);
        for name in [GgmlType::Q4_0, GgmlType::Q6_K].map(|t| matmul_kernel(t, 64).unwrap()) {
            assert!(super::super::kernels::file_of(name).is_some(), "{name}");
        }
        // Every type with a matmul has an expert kernel, and MXFP4 (experts only) too.
        for ty in MATMUL_TYPES.into_iter().chain([GgmlType::MXFP4]) {
            let name = moe_gemv_kernel(ty).unwrap();
            assert!(super::super::kernels::file_of(name).is_some(), "{name}");
        }
        assert_eq!(moe_gemv_config(9, 12).grid_dim, (3, 12, 1));
    }

    #[test]
    fn sample_row_layout_is_the_kernels() {
        let r = SampleRow {
            temperature: 0.5,
            top_p: 0.25,
            min_p: 0.125,
            top_k: 40,
            seed: 0x0102_0304_0506_0708,
            step: 9,
        };
        let b = SampleRow::encode(&[r, r]);
        assert_eq!(b.len(), 2 * SampleRow::BYTES);
        assert_eq!(&b[0..4], &0.5f32.to_le_bytes());
        assert_eq!(&b[12..16], &40u32.to_le_bytes());
        assert_eq!(&b[16..24], &0x0102_0304_0506_0708u64.to_le_bytes());
        assert_eq!(&b[24..32], &9u64.to_le_bytes());
        assert_eq!(&b[32..64], &b[0..32]);
        let greedy = SamplingParams::greedy();
        assert_eq!(SampleRow::new(&greedy, 1, 0).unwrap().temperature, 0.0);
        let penalized = SamplingParams {
            repetition_penalty: 1.1,
            ..greedy
        };
        assert_eq!(SampleRow::new(&penalized, 1, 0), None);
    }
}
