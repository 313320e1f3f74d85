//! LFM2's gated short convolution on the CPU, as llama.cpp's graph computes it: B ⊙ x and
//! C ⊙ conv (`ggml_mul`), and the causal depthwise convolution (`ggml_ssm_conv`: per channel,
//! an f32 sum over the taps from the oldest position, starting at 0) over the sequence's state
//! rows followed by this step's.

/// One sequence's span of tokens, rows of `n` values: `b` and `x` its rows of B and x, `c` its
/// rows of C, replaced by C ⊙ conv(B ⊙ x); `state` the B ⊙ x rows of the `taps - 1` positions
/// before the span (oldest first; `fresh`: there are none, the span starts the sequence),
/// left holding the last `taps - 1` rows; `kernel` `taps` values per channel. Each of `saves`
/// (the span's tokens before a snapshot, and its part of the snapshot's slot) gets the state
/// there.
#[allow(clippy::too_many_arguments)]
pub fn conv_span(
    b: &[f32],
    x: &[f32],
    c: &mut [f32],
    state: &mut [f32],
    fresh: bool,
    kernel: &[f32],
    (taps, n): (usize, usize),
    saves: &mut [(usize, &mut [f32])],
) {
    let d = taps - 1;
    let tokens = b.len() / n;
    if fresh {
        state.fill(0.0);
    }
    // The rows the convolution slides over: the state's, then the span's B ⊙ x.
    let mut rows = Vec::with_capacity((d + tokens) * n);
    rows.extend_from_slice(state);
    rows.extend(b.iter().zip(x).map(|(&b, &x)| b * x));
    for t in 0..tokens {
        let window = &rows[t * n..(t + taps) * n];
        for (j, c) in c[t * n..(t + 1) * n].iter_mut().enumerate() {
            let taps_j = &kernel[j * taps..(j + 1) * taps];
            let mut sum = 0f32;
            for (k, &w) in taps_j.iter().enumerate() {
                sum += window[k * n + j] * w;
            }
            *c *= sum;
        }
    }
    keep_rows(&rows, n, state, saves);
}

/// A convolution's state after a span: `rows` holds the state's rows, then the span's (rows
/// of `n`); the last `state.len() / n` of them go into `state`, and each of `saves` (the
/// span's tokens before a snapshot, where it goes) gets the rows before that token.
pub fn keep_rows(rows: &[f32], n: usize, state: &mut [f32], saves: &mut [(usize, &mut [f32])]) {
    let d = state.len();
    for (t, to) in saves.iter_mut() {
        to.copy_from_slice(&rows[*t * n..*t * n + d]);
    }
    state.copy_from_slice(&rows[rows.len() - d..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two channels, three taps: the convolution of each channel's B ⊙ x with its kernel,
    /// the same whether a sequence runs in one span or one token at a time.
    #[test]
    fn spans_carry_the_state_and_match_one_pass() {
        let (n, taps) = (2, 3);
        let kernel = [0.5, -1.0, 2.0, 1.0, 0.0, 0.25];
        let b: Vec<f32> = (0..10).map(|i| 1.0 + i as f32 * 0.5).collect();
        let x: Vec<f32> = (0..10).map(|i| (i as f32 - 4.0) * 0.25).collect();
        let c: Vec<f32> = (0..10).map(|i| 0.5 + (i % 3) as f32).collect();
        let mut whole = c.clone();
        let mut state = vec![9.0; (taps - 1) * n];
        let mut after_two = vec![0.0; (taps - 1) * n];
        let mut saves = [(2, &mut after_two[..])];
        conv_span(
            &b,
            &x,
            &mut whole,
            &mut state,
            true,
            &kernel,
            (taps, n),
            &mut saves,
        );
        // By hand, channel 0 at token 2: taps over tokens 0, 1, 2.
        let bx = |t: usize, j: usize| b[t * n + j] * x[t * n + j];
        let want = c[4] * (bx(0, 0) * 0.5 + -bx(1, 0) + bx(2, 0) * 2.0);
        assert_eq!(whole[4], want);
        // Token 0 sees only itself (the state before position 0 is empty).
        assert_eq!(whole[1], c[1] * (bx(0, 1) * 0.25));
        assert_eq!(state, [bx(3, 0), bx(3, 1), bx(4, 0), bx(4, 1)]);
        assert_eq!(after_two, [bx(0, 0), bx(0, 1), bx(1, 0), bx(1, 1)]);

        let mut steps = c.clone();
        let mut state = vec![0.0; (taps - 1) * n];
        for t in 0..5 {
            let r = t * n..(t + 1) * n;
            conv_span(
                &b[r.clone()],
                &x[r.clone()],
                &mut steps[r],
                &mut state,
                t == 0,
                &kernel,
                (taps, n),
                &mut [],
            );
        }
        assert_eq!(steps, whole);
    }
}
