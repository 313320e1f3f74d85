//! kernels/recurrent.cu against the CPU's functions on random data: two sequences in one
//! launch, one starting from position 0 (its slot's stale contents must not be read), the other
//! from the state its slot holds, with snapshots saved after some of the first one's tokens.
//! The convolutions compute the CPU's products and sums in its order, so they must match it
//! bit for bit; the delta rule sums its dot products in another order, so it matches to
//! rounding.

use super::{open, Xs};
use cudarc::driver::{CudaStream, LaunchConfig, PushKernelArg};
use edgelm::backend::cpu::delta_net::{
    conv_silu_span, delta_step, gated_rmsnorm, head_ranges, l2_normalize, DeltaStep,
};
use edgelm::backend::cpu::short_conv::conv_span;
use edgelm::backend::ops::DeltaNetShape;
use std::sync::Arc;

/// The step's sequences as kernels/recurrent.cu reads them (`SEQ_*`, `SAVE_*`): sequence 0
/// is 5 tokens from position 0 in slot 1, saved after 2 tokens into slot 3 and after all 5
/// into slot 4; sequence 1 is 3 tokens resuming from slot 0.
const SEQS: [i32; 12] = [0, 5, 1, 1, 0, 2, 5, 3, 0, 0, 2, 0];
const SAVES: [i32; 4] = [2, 3, 5, 4];
const SLOTS: usize = 5;
const TOKENS: usize = 8;

/// (first token, tokens, slot, fresh) of a sequence, and its saves (after, slot).
type Span = (usize, usize, usize, bool, Vec<(usize, usize)>);

/// The sequences of [`SEQS`] and [`SAVES`].
fn spans() -> Vec<Span> {
    vec![
        (0, 5, 1, true, vec![(2, 3), (5, 4)]),
        (5, 3, 0, false, vec![]),
    ]
}

fn random(rng: &mut Xs, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.sym() * scale).collect()
}

fn meta(
    s: &Arc<CudaStream>,
) -> (
    cudarc::driver::CudaSlice<i32>,
    cudarc::driver::CudaSlice<i32>,
) {
    (s.clone_htod(&SEQS).unwrap(), s.clone_htod(&SAVES).unwrap())
}

fn grid(x: u32, y: u32, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (x, y, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The CPU's convolution of every sequence, on `states` (slots of `slot_floats`, the layer's
/// part at `off`); `conv(tokens, state, fresh, saves)` runs one span.
fn cpu_conv(
    states: &mut [f32],
    slot_floats: usize,
    (off, len): (usize, usize),
    mut conv: impl FnMut(std::ops::Range<usize>, &mut [f32], bool, &mut [(usize, &mut [f32])]),
) {
    for (start, n, slot, fresh, saves) in spans() {
        let mut snaps: Vec<Vec<f32>> = saves.iter().map(|_| vec![0.0; len]).collect();
        let mut state = states[slot * slot_floats + off..][..len].to_vec();
        {
            let mut to: Vec<(usize, &mut [f32])> = saves
                .iter()
                .zip(&mut snaps)
                .map(|(&(after, _), v)| (after, &mut v[..]))
                .collect();
            conv(start..start + n, &mut state, fresh, &mut to);
        }
        states[slot * slot_floats + off..][..len].copy_from_slice(&state);
        for ((_, to), v) in saves.iter().zip(snaps) {
            states[to * slot_floats + off..][..len].copy_from_slice(&v);
        }
    }
}

#[test]
#[ignore = "needs a CUDA device: packaging/gpu-check.sh runs it"]
fn device_convolutions_match_the_cpu_bit_for_bit() {
    let dev = open();
    let s = dev.ctx.default_stream();
    let mut rng = Xs(0x2545_f491_4f6c_dd1d);
    let (seqs, saves) = meta(&s);
    for (name, taps) in [("short_conv", 3usize), ("conv_silu", 4)] {
        let n = 300; // more channels than one block of threads
        let (off, len) = (7, (taps - 1) * n);
        let slot_floats = off + len + 5;
        let init = random(&mut rng, SLOTS * slot_floats, 1.0);
        let kernel = random(&mut rng, taps * n, 0.5);
        let (b, x, c) = (
            random(&mut rng, TOKENS * n, 1.0),
            random(&mut rng, TOKENS * n, 1.0),
            random(&mut rng, TOKENS * n, 1.0),
        );
        let mut st_d = s.clone_htod(&init).unwrap();
        let mut io_d = s.clone_htod(&c).unwrap();
        let (b_d, x_d, k_d) = (
            s.clone_htod(&b).unwrap(),
            s.clone_htod(&x).unwrap(),
            s.clone_htod(&kernel).unwrap(),
        );
        let (sf, o, t, n32) = (slot_floats as i64, off as i64, taps as i32, n as i32);
        let f = dev.function(name).unwrap();
        let mut l = s.launch_builder(f);
        if name == "short_conv" {
            l.arg(&b_d).arg(&x_d);
        }
        l.arg(&mut io_d)
            .arg(&mut st_d)
            .arg(&sf)
            .arg(&o)
            .arg(&seqs)
            .arg(&saves)
            .arg(&k_d)
            .arg(&t)
            .arg(&n32);
        unsafe { l.launch(grid(n.div_ceil(256) as u32, 2, 256)) }.unwrap();
        let (got_io, got_states) = (s.clone_dtoh(&io_d).unwrap(), s.clone_dtoh(&st_d).unwrap());

        let (mut want_io, mut want_states) = (c.clone(), init.clone());
        cpu_conv(
            &mut want_states,
            slot_floats,
            (off, len),
            |r, st, fresh, to| {
                let rows = r.start * n..r.end * n;
                if name == "short_conv" {
                    let (b, x) = (&b[rows.clone()], &x[rows.clone()]);
                    conv_span(b, x, &mut want_io[rows], st, fresh, &kernel, (taps, n), to);
                } else {
                    let mut io = c[rows.clone()].to_vec();
                    conv_silu_span(&mut io, st, fresh, &kernel, (taps, n), to);
                    want_io[rows].copy_from_slice(&io);
                }
            },
        );
        assert_eq!(got_io, want_io, "{name}: outputs");
        assert_eq!(got_states, want_states, "{name}: states and snapshots");
        eprintln!("{name}: {TOKENS} tokens of 2 sequences, states and snapshots bit for bit");
    }
}

/// The DeltaNet of the test: 2 key heads of 64 shared by 4 value heads.
const DN: DeltaNetShape = DeltaNetShape {
    head_dim: 64,
    k_heads: 2,
    v_heads: 4,
    taps: 4,
};

/// The CPU's delta rule over every sequence (q and k already L2-normalised in `mix`), its
/// outputs over `z`, its matrices in `states` (slots of the heads' matrices).
#[allow(clippy::too_many_arguments)]
fn cpu_delta_rule(
    mix: &[f32],
    (beta, alpha): (&[f32], &[f32]),
    (dt_bias, a, norm): (&[f32], &[f32], &[f32]),
    eps: f32,
    z: &mut [f32],
    states: &mut [f32],
) {
    let (hd, vh, n) = (DN.head_dim, DN.v_heads, DN.channels());
    let slot_floats = vh * hd * hd;
    cpu_conv(states, slot_floats, (0, slot_floats), |r, st, fresh, to| {
        if fresh {
            st.fill(0.0);
        }
        for t in r.clone() {
            for h in 0..vh {
                let (q, k, v) = head_ranges(&DN, h);
                let row = &mix[t * n..(t + 1) * n];
                let step = DeltaStep {
                    q: &row[q],
                    k: &row[k],
                    v: &row[v],
                    beta: beta[t * vh + h],
                    alpha: alpha[t * vh + h],
                    dt_bias: dt_bias[h],
                    a: a[h],
                };
                let mut o = vec![0f32; hd];
                delta_step(&mut st[h * hd * hd..(h + 1) * hd * hd], &step, &mut o);
                gated_rmsnorm(&o, norm, eps, &mut z[(t * vh + h) * hd..][..hd]);
            }
            for (after, snap) in to.iter_mut() {
                if r.start + *after == t + 1 {
                    snap.copy_from_slice(st);
                }
            }
        }
    });
}

fn close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len());
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "{what}[{i}]: {g} vs {w}"
        );
    }
}

#[test]
#[ignore = "needs a CUDA device: packaging/gpu-check.sh runs it"]
fn device_delta_rule_matches_the_cpu() {
    let dev = open();
    let s = dev.ctx.default_stream();
    let mut rng = Xs(0x9e37_79b9_7f4a_7c15);
    let (seqs, saves) = meta(&s);
    let (hd, vh, n, eps) = (DN.head_dim, DN.v_heads, DN.channels(), 1e-6f32);
    let slot_floats = vh * hd * hd;
    let init = random(&mut rng, SLOTS * slot_floats, 0.3);
    let mix = random(&mut rng, TOKENS * n, 1.0);
    let (beta, alpha) = (
        random(&mut rng, TOKENS * vh, 2.0),
        random(&mut rng, TOKENS * vh, 2.0),
    );
    let z = random(&mut rng, TOKENS * vh * hd, 2.0);
    let dt_bias = random(&mut rng, vh, 1.0);
    let a: Vec<f32> = random(&mut rng, vh, 0.5).iter().map(|v| v - 0.6).collect();
    let norm: Vec<f32> = random(&mut rng, hd, 0.2).iter().map(|v| v + 1.0).collect();

    let mut mix_d = s.clone_htod(&mix).unwrap();
    let (heads, rows) = ((2 * DN.k_heads) as i32, TOKENS as i64);
    let l2 = dev.function("l2_norm_heads").unwrap();
    unsafe {
        s.launch_builder(l2)
            .arg(&mut mix_d)
            .arg(&(n as i32))
            .arg(&heads)
            .arg(&(hd as i32))
            .arg(&eps)
            .arg(&rows)
            .launch(grid(8, 1, 256))
    }
    .unwrap();
    let mut want_mix = mix.clone();
    for row in want_mix.chunks_exact_mut(n) {
        row[..2 * DN.key_dim()]
            .chunks_exact_mut(hd)
            .for_each(|h| l2_normalize(h, eps));
    }
    close(
        "l2_norm_heads",
        &s.clone_dtoh(&mix_d).unwrap(),
        &want_mix,
        1e-6,
    );

    let up = |v: &[f32]| s.clone_htod(v).unwrap();
    let (b_d, al_d, dt_d, a_d, nm_d) = (up(&beta), up(&alpha), up(&dt_bias), up(&a), up(&norm));
    let (mut z_d, mut st_d) = (up(&z), up(&init));
    let (kh, vh32, sf, off) = (DN.k_heads as i32, vh as i32, slot_floats as i64, 0i64);
    let f = dev.function("delta_rule_d64").unwrap();
    unsafe {
        s.launch_builder(f)
            .arg(&mix_d)
            .arg(&b_d)
            .arg(&al_d)
            .arg(&mut z_d)
            .arg(&dt_d)
            .arg(&a_d)
            .arg(&nm_d)
            .arg(&eps)
            .arg(&kh)
            .arg(&vh32)
            .arg(&mut st_d)
            .arg(&sf)
            .arg(&off)
            .arg(&seqs)
            .arg(&saves)
            .launch(grid(vh as u32, 2, (hd / 8 * 32) as u32))
    }
    .unwrap();
    let (mut want_z, mut want_states) = (z.clone(), init.clone());
    let weights = (&dt_bias[..], &a[..], &norm[..]);
    cpu_delta_rule(
        &want_mix,
        (&beta, &alpha),
        weights,
        eps,
        &mut want_z,
        &mut want_states,
    );
    close(
        "delta_rule outputs",
        &s.clone_dtoh(&z_d).unwrap(),
        &want_z,
        1e-4,
    );
    close(
        "delta_rule states and snapshots",
        &s.clone_dtoh(&st_d).unwrap(),
        &want_states,
        1e-5,
    );
    eprintln!("delta_rule_d64: {TOKENS} tokens of 2 sequences, states and snapshots match");
}
