//! llama-perplexity's KL-divergence method, in its own file format, so that either engine's
//! base file can be compared against the other's logits.
//!
//! The file (`--kl-divergence-base`): the 8 bytes `_logits_`; u32 n_ctx; i32 n_vocab; i32
//! n_chunk; the chunks' tokens (n_chunk·n_ctx i32, as tokenized, before BOS replaces each
//! chunk's first one); then for each scored position of each chunk (n_ctx − 1 − n_ctx/2 per
//! chunk) `nv = 2·⌈n_vocab/2⌉ + 4` u16: the first four hold two f32 (scale, minimum
//! log-probability), the rest each token's log-probability above that minimum in units of
//! `scale` (those more than 16 nats below the top are 0). The arithmetic below follows
//! tools/perplexity/perplexity.cpp statement for statement, f32 where it is f32.

use anyhow::{bail, Context, Result};
use std::io::{Read, Write};

const MAGIC: &[u8; 8] = b"_logits_";

/// u16 entries per scored position.
pub fn row_len(n_vocab: usize) -> usize {
    2 * n_vocab.div_ceil(2) + 4
}

/// ggml's `nearest_int`: round to nearest (ties to even) through the float's mantissa.
fn nearest_int(v: f32) -> i32 {
    let bits = (v + 12_582_912.0).to_bits() as i32;
    (bits & 0x007f_ffff) - 0x0040_0000
}

/// Encodes one position's logits into `out` (`row_len` entries); returns its negative
/// log-likelihood of `tok`.
pub fn encode_row(logits: &[f32], tok: usize, out: &mut [u16]) -> f64 {
    let max_logit = logits.iter().copied().fold(logits[0], f32::max);
    let min_logit = logits.iter().copied().fold(logits[0], f32::min);
    let min_logit = min_logit.max(max_logit - 16.0);
    let sum_exp: f64 = logits.iter().map(|&l| (l - max_logit).exp() as f64).sum();
    let log_sum_exp = sum_exp.ln() as f32;
    let min_log_prob = min_logit - max_logit - log_sum_exp;
    let scale = (max_logit - min_logit) / 65535.0;
    out[..2].copy_from_slice(&halves(scale));
    out[2..4].copy_from_slice(&halves(min_log_prob));
    let vals = &mut out[4..4 + logits.len()];
    if scale != 0.0 {
        let inv = 1.0 / scale;
        for (o, &l) in vals.iter_mut().zip(logits) {
            *o = if l > min_logit {
                nearest_int(inv * (l - min_logit)) as u16
            } else {
                0
            };
        }
    } else {
        vals.fill(0);
    }
    (max_logit + log_sum_exp - logits[tok]) as f64
}

/// An f32 as the two u16 it occupies in the file (little-endian).
fn halves(v: f32) -> [u16; 2] {
    let b = v.to_le_bytes();
    [
        u16::from_le_bytes([b[0], b[1]]),
        u16::from_le_bytes([b[2], b[3]]),
    ]
}

fn from_halves(h: &[u16]) -> f32 {
    let (a, b) = (h[0].to_le_bytes(), h[1].to_le_bytes());
    f32::from_le_bytes([a[0], a[1], b[0], b[1]])
}

/// The header of a base file.
pub struct Header {
    pub n_ctx: usize,
    pub n_vocab: usize,
    pub tokens: Vec<u32>,
}

pub fn write_header(
    w: &mut impl Write,
    n_ctx: usize,
    n_vocab: usize,
    tokens: &[u32],
) -> Result<()> {
    let n_chunk = tokens.len() / n_ctx;
    w.write_all(MAGIC)?;
    w.write_all(&(n_ctx as u32).to_le_bytes())?;
    w.write_all(&(n_vocab as i32).to_le_bytes())?;
    w.write_all(&(n_chunk as i32).to_le_bytes())?;
    for &t in &tokens[..n_chunk * n_ctx] {
        w.write_all(&(t as i32).to_le_bytes())?;
    }
    Ok(())
}

pub fn write_rows(w: &mut impl Write, rows: &[u16]) -> Result<()> {
    let bytes: Vec<u8> = rows.iter().flat_map(|v| v.to_le_bytes()).collect();
    w.write_all(&bytes)?;
    Ok(())
}

fn read_u32(r: &mut impl Read) -> Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

pub fn read_header(r: &mut impl Read) -> Result<Header> {
    let mut magic = [0u8; 8];
    r.read_exact(&mut magic)
        .context("the file is too short for a log-probability file")?;
    if &magic != MAGIC {
        bail!("the file does not look like a file of log-probabilities (no _logits_ header)");
    }
    let n_ctx = read_u32(r)? as usize;
    let n_vocab = read_u32(r)? as i32;
    let n_chunk = read_u32(r)? as i32;
    if n_ctx < 8 || n_vocab <= 0 || n_chunk <= 0 || n_ctx > 1 << 20 || n_chunk > 1 << 20 {
        bail!("implausible header: n_ctx {n_ctx}, n_vocab {n_vocab}, n_chunk {n_chunk}");
    }
    let mut raw = vec![0u8; n_ctx * n_chunk as usize * 4];
    r.read_exact(&mut raw)
        .context("the file ends inside its tokens")?;
    let tokens = raw
        .chunks_exact(4)
        .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as u32)
        .collect();
    Ok(Header {
        n_ctx,
        n_vocab: n_vocab as usize,
        tokens,
    })
}

pub fn read_rows(r: &mut impl Read, rows: &mut [u16]) -> Result<()> {
    let mut raw = vec![0u8; rows.len() * 2];
    r.read_exact(&mut raw)
        .context("the file ends inside a chunk's log-probabilities")?;
    for (v, b) in rows.iter_mut().zip(raw.chunks_exact(2)) {
        *v = u16::from_le_bytes([b[0], b[1]]);
    }
    Ok(())
}

/// Running sums over every scored position (llama.cpp's `kl_divergence_result`).
#[derive(Default)]
pub struct Kld {
    sum_nll: f64,
    sum_nll2: f64,
    sum_nll_base: f64,
    sum_nll_base2: f64,
    sum_nll_nll_base: f64,
    sum_kld: f64,
    sum_kld2: f64,
    sum_p_diff: f64,
    sum_p_diff2: f64,
    sum_p_diff4: f64,
    n_same_top: usize,
    count: usize,
    klds: Vec<f32>,
    p_diffs: Vec<f32>,
}

impl Kld {
    /// Adds one position: our `logits`, the base's encoded row, the true next token.
    pub fn add(&mut self, logits: &[f32], base: &[u16], tok: usize) {
        let mut imax = 0;
        let mut max_logit = logits[0];
        for (i, &l) in logits.iter().enumerate().skip(1) {
            if l > max_logit {
                max_logit = l;
                imax = i;
            }
        }
        let sum_exp: f64 = logits.iter().map(|&l| (l - max_logit).exp() as f64).sum();
        let log_sum_exp = sum_exp.ln() as f32;
        let scale = from_halves(&base[0..2]);
        let min_log_prob = from_halves(&base[2..4]);
        let base = &base[4..];
        let nll = max_logit + log_sum_exp - logits[tok];
        self.sum_nll += nll as f64;
        self.sum_nll2 += (nll * nll) as f64;
        let nll_base = -(scale * base[tok] as f32 + min_log_prob);
        self.sum_nll_base += nll_base as f64;
        self.sum_nll_base2 += (nll_base * nll_base) as f64;
        self.sum_nll_nll_base += (nll * nll_base) as f64;
        let max_logit = max_logit + log_sum_exp;
        let mut sum = 0f64;
        let (mut imax_base, mut p_log_base_max) = (0usize, 0f32);
        for (i, &l) in logits.iter().enumerate() {
            let p_log_base = scale * base[i] as f32 + min_log_prob;
            if i == 0 || p_log_base > p_log_base_max {
                p_log_base_max = p_log_base;
                imax_base = i;
            }
            if p_log_base > -16.0 {
                let p_base = p_log_base.exp();
                sum += (p_base * (p_log_base - l + max_logit)) as f64;
            }
        }
        self.sum_kld += sum;
        self.sum_kld2 += sum * sum;
        self.count += 1;
        if imax == imax_base {
            self.n_same_top += 1;
        }
        let p_diff = (-nll).exp() - (-nll_base).exp();
        self.sum_p_diff += p_diff as f64;
        let p_diff2 = (p_diff * p_diff) as f64;
        self.sum_p_diff2 += p_diff2;
        self.sum_p_diff4 += p_diff2 * p_diff2;
        self.klds.push(sum as f32);
        self.p_diffs.push(p_diff);
    }

    /// Mean KLD, same-top fraction and PPL(Q) so far.
    #[cfg(test)]
    fn summary(&self) -> (f64, f64, f64) {
        let (kld, _) = mean_and_uncertainty(self.sum_kld, self.sum_kld2, self.count);
        let (lp, _) = mean_and_uncertainty(self.sum_nll, self.sum_nll2, self.count);
        (
            kld,
            self.n_same_top as f64 / self.count.max(1) as f64,
            lp.exp(),
        )
    }

    /// One progress line per chunk, as llama-perplexity prints them.
    pub fn chunk_line(&self, chunk: usize) -> String {
        let (lp, lp_unc) = mean_and_uncertainty(self.sum_nll, self.sum_nll2, self.count);
        let (lb, lb_unc) = mean_and_uncertainty(self.sum_nll_base, self.sum_nll_base2, self.count);
        let cov = covariance(
            self.sum_nll,
            self.sum_nll_base,
            self.sum_nll_nll_base,
            self.count,
        );
        let ratio_unc = (lp_unc * lp_unc + lb_unc * lb_unc - 2.0 * cov).sqrt();
        let (kld, kld_unc) = mean_and_uncertainty(self.sum_kld, self.sum_kld2, self.count);
        let (mse, mse_unc) = mean_and_uncertainty(self.sum_p_diff2, self.sum_p_diff4, self.count);
        let rms = mse.sqrt();
        let top = self.n_same_top as f64 / self.count as f64;
        let top_unc = (top * (1.0 - top) / (self.count as f64 - 1.0)).sqrt();
        format!(
            "{:4}    {:9.4} ± {:9.4}    {:10.5} ± {:10.5}    {:10.5} ± {:10.5}    {:6.3} ± {:6.3} %    {:6.3} ± {:6.3} %",
            chunk,
            lp.exp(),
            lp.exp() * lp_unc,
            lp - lb,
            ratio_unc,
            kld,
            kld_unc,
            100.0 * rms,
            100.0 * 0.5 / rms * mse_unc,
            100.0 * top,
            100.0 * top_unc
        )
    }

    /// The closing statistics, in llama-perplexity's words and layout.
    pub fn report(&self) -> String {
        let mut lines = self.perplexity_lines();
        lines.push(String::new());
        lines.extend(self.kld_lines());
        lines.push(String::new());
        lines.extend(self.probability_lines());
        lines.iter().map(|l| format!("{l}\n")).collect()
    }

    /// Both perplexities and how they relate.
    fn perplexity_lines(&self) -> Vec<String> {
        let (lp, lp_unc) = mean_and_uncertainty(self.sum_nll, self.sum_nll2, self.count);
        let (lb, lb_unc) = mean_and_uncertainty(self.sum_nll_base, self.sum_nll_base2, self.count);
        let (ppl, ppl_base) = (lp.exp(), lb.exp());
        let (ppl_unc, ppl_base_unc) = (ppl * lp_unc, ppl_base * lb_unc);
        let cov = covariance(
            self.sum_nll,
            self.sum_nll_base,
            self.sum_nll_nll_base,
            self.count,
        );
        let ratio_unc = (lp_unc * lp_unc + lb_unc * lb_unc - 2.0 * cov).sqrt();
        let ratio = (lp - lb).exp();
        let diff_unc =
            (ppl_unc * ppl_unc + ppl_base_unc * ppl_base_unc - 2.0 * ppl * ppl_base * cov).sqrt();
        vec![
            "====== Perplexity statistics ======".into(),
            format!("Mean PPL(Q)                   : {ppl:10.6} ± {ppl_unc:10.6}"),
            format!("Mean PPL(base)                : {ppl_base:10.6} ± {ppl_base_unc:10.6}"),
            format!(
                "Cor(ln(PPL(Q)), ln(PPL(base))): {:6.2}%",
                100.0 * cov / (lp_unc * lb_unc)
            ),
            format!(
                "Mean ln(PPL(Q)/PPL(base))     : {:10.6} ± {ratio_unc:10.6}",
                lp - lb
            ),
            format!(
                "Mean PPL(Q)/PPL(base)         : {ratio:10.6} ± {:10.6}",
                ratio * ratio_unc
            ),
            format!(
                "Mean PPL(Q)-PPL(base)         : {:10.6} ± {diff_unc:10.6}",
                ppl - ppl_base
            ),
        ]
    }

    /// The KL divergence's mean and its distribution over the tokens.
    fn kld_lines(&self) -> Vec<String> {
        let (kld, kld_unc) = mean_and_uncertainty(self.sum_kld, self.sum_kld2, self.count);
        let mut k = self.klds.clone();
        k.sort_by(f32::total_cmp);
        let mut lines = vec![
            "====== KL divergence statistics ======".into(),
            format!("Mean    KLD: {kld:10.6} ± {kld_unc:10.6}"),
            format!("Maximum KLD: {:10.6}", k[k.len() - 1]),
        ];
        for (label, f) in [
            ("99.9%", 0.999),
            ("99.0%", 0.99),
            ("95.0%", 0.95),
            ("90.0%", 0.9),
        ] {
            lines.push(format!("{label}   KLD: {:10.6}", percentile(&k, f)));
        }
        lines.push(format!("Median  KLD: {:10.6}", median(&k)));
        for (label, f) in [
            ("10.0%", 0.1),
            (" 5.0%", 0.05),
            (" 1.0%", 0.01),
            (" 0.1%", 0.001),
        ] {
            lines.push(format!("{label}   KLD: {:10.6}", percentile(&k, f)));
        }
        lines.push(format!("Minimum KLD: {:10.6}", k[0]));
        lines
    }

    /// How the probability of the right token moved (Δp), and how often the top token agreed.
    fn probability_lines(&self) -> Vec<String> {
        let (pd, pd_unc) = mean_and_uncertainty(self.sum_p_diff, self.sum_p_diff2, self.count);
        let mut p = self.p_diffs.clone();
        p.sort_by(f32::total_cmp);
        let mut lines = vec![
            "====== Token probability statistics ======".into(),
            format!("Mean    Δp: {:6.3} ± {:5.3} %", 100.0 * pd, 100.0 * pd_unc),
            format!("Maximum Δp: {:6.3}%", 100.0 * p[p.len() - 1]),
        ];
        for (label, f) in [
            ("99.9%", 0.999),
            ("99.0%", 0.99),
            ("95.0%", 0.95),
            ("90.0%", 0.9),
            ("75.0%", 0.75),
        ] {
            lines.push(format!("{label}   Δp: {:6.3}%", 100.0 * percentile(&p, f)));
        }
        lines.push(format!("Median  Δp: {:6.3}%", 100.0 * median(&p)));
        for (label, f) in [
            ("25.0%", 0.25),
            ("10.0%", 0.1),
            (" 5.0%", 0.05),
            (" 1.0%", 0.01),
            (" 0.1%", 0.001),
        ] {
            lines.push(format!("{label}   Δp: {:6.3}%", 100.0 * percentile(&p, f)));
        }
        lines.push(format!("Minimum Δp: {:6.3}%", 100.0 * p[0]));
        let (mse, mse_unc) = mean_and_uncertainty(self.sum_p_diff2, self.sum_p_diff4, self.count);
        let rms = mse.sqrt();
        lines.push(format!(
            "RMS Δp    : {:6.3} ± {:5.3} %",
            100.0 * rms,
            100.0 * 0.5 / rms * mse_unc
        ));
        let top = self.n_same_top as f64 / self.count as f64;
        lines.push(format!(
            "Same top p: {:6.3} ± {:5.3} %",
            100.0 * top,
            100.0 * (top * (1.0 - top) / (self.count as f64 - 1.0)).sqrt()
        ));
        lines
    }
}

fn mean_and_uncertainty(sum: f64, sum2: f64, count: usize) -> (f64, f64) {
    if count < 1 {
        return (0.0, 0.0);
    }
    let f = sum / count as f64;
    let df = sum2 / count as f64 - f * f;
    let df = if df > 0.0 && count > 10 {
        (df / (count as f64 - 1.0)).sqrt()
    } else {
        0.0
    };
    (f, df)
}

fn covariance(a: f64, b: f64, ab: f64, count: usize) -> f64 {
    if count < 10 {
        return 0.0;
    }
    let n = count as f64;
    (ab / n - (a / n) * (b / n)) / (n - 1.0)
}

fn percentile(sorted: &[f32], fraction: f32) -> f32 {
    if fraction <= 0.0 {
        return sorted[0];
    }
    if fraction >= 1.0 {
        return sorted[sorted.len() - 1];
    }
    let p = fraction * (sorted.len() - 1) as f32;
    let ip = p as usize;
    let p = p - ip as f32;
    (1.0 - p) * sorted[ip] + p * sorted[(ip + 1).min(sorted.len() - 1)]
}

fn median(sorted: &[f32]) -> f32 {
    let n = sorted.len();
    if n.is_multiple_of(2) {
        0.5 * (sorted[n / 2] + sorted[n / 2 - 1])
    } else {
        sorted[n / 2]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_decodes_to_its_log_probabilities() {
        let logits: Vec<f32> = (0..101)
            .map(|i| ((i * 37) % 23) as f32 * 0.7 - 5.0)
            .collect();
        let mut row = vec![0u16; row_len(logits.len())];
        let nll = encode_row(&logits, 7, &mut row);
        let max = logits.iter().copied().fold(f32::MIN, f32::max);
        let lse = max + logits.iter().map(|l| (l - max).exp()).sum::<f32>().ln();
        assert!((nll - (lse - logits[7]) as f64).abs() < 1e-4);
        let (scale, min) = (from_halves(&row[0..2]), from_halves(&row[2..4]));
        for (i, &l) in logits.iter().enumerate() {
            let back = scale * row[4 + i] as f32 + min;
            assert!(
                (back - (l - lse)).abs() <= scale,
                "{i}: {back} vs {}",
                l - lse
            );
        }
        // The same logits against their own row: no divergence, the same top token.
        let mut k = Kld::default();
        k.add(&logits, &row, 7);
        let (kld, top, _) = k.summary();
        assert!(kld.abs() < 1e-3, "{kld}");
        assert_eq!(top, 1.0);
    }

    #[test]
    fn header_round_trips_and_garbage_is_refused() {
        let tokens: Vec<u32> = (0..40).collect();
        let mut buf = Vec::new();
        write_header(&mut buf, 16, 1000, &tokens).unwrap();
        let h = read_header(&mut &buf[..]).unwrap();
        assert_eq!((h.n_ctx, h.n_vocab), (16, 1000));
        assert_eq!(h.tokens, tokens[..32]);
        assert!(read_header(&mut &b"not a logits file"[..]).is_err());
        assert!(read_header(&mut &buf[..20]).is_err());
    }

    #[test]
    fn nearest_int_rounds_half_to_even() {
        assert_eq!(nearest_int(2.5), 2);
        assert_eq!(nearest_int(3.5), 4);
        assert_eq!(nearest_int(65534.6), 65535);
    }
}
