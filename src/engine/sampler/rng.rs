//! A small seeded generator (SplitMix64): per-request reproducible sampling needs only this.

#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// A seed from the clock, for requests that give none.
    pub fn from_entropy() -> Rng {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        Rng(t ^ GOLDEN)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GOLDEN);
        mix(self.0)
    }

    /// The generator's counter: `nth_f32(state, 0)` is the next draw, so a device sampler given
    /// (state, 0) takes the draw this generator would take next.
    pub fn state(&self) -> u64 {
        self.0
    }

    /// Uniform in [0, 1).
    pub fn next_f32(&mut self) -> f32 {
        to_f32(self.next_u64())
    }

    /// What `next_f32` returns after `step` earlier draws of `Rng::new(seed)`, without making
    /// them: SplitMix64 is counter-based (draw n mixes seed + n * golden), which is what lets
    /// the device sampler (kernels/sample.cu `draw24`) take the same draw from (seed, step).
    pub fn nth_f32(seed: u64, step: u64) -> f32 {
        to_f32(mix(
            seed.wrapping_add(step.wrapping_add(1).wrapping_mul(GOLDEN))
        ))
    }
}

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn to_f32(z: u64) -> f32 {
    (z >> 40) as f32 / (1u64 << 24) as f32
}

#[cfg(test)]
mod tests {
    use super::Rng;

    #[test]
    fn nth_draw_is_the_sequential_draw() {
        for seed in [0, 7, u64::MAX, 0x9E37_79B9_7F4A_7C15] {
            let mut r = Rng::new(seed);
            for step in 0..100 {
                assert_eq!(
                    Rng::nth_f32(seed, step),
                    r.next_f32(),
                    "seed {seed} step {step}"
                );
                assert_eq!(Rng::nth_f32(r.state(), 0), r.clone().next_f32());
            }
        }
    }
}
