//! SplitMix64, the same on every target: [`counter_u24`], the sampler's counter-based draws (CPU
//! and GPU alike), and [`Rng`], a sequential generator for tests' random data. Not cryptographic.

/// SplitMix64's increment (the golden ratio in 64 bits).
const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's output function.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The sampler's uniform for draw `counter` of stream `seed`, as a 24-bit integer (the uniform
/// is this / 2^24): the top 24 bits of SplitMix64's output number `counter + 1` from state
/// `seed`, i.e. `mix64(seed + (counter + 1) * GAMMA)`. A pure function of (seed, counter), so a
/// draw replays exactly whenever the same position is predicted again (steps undone, a preempted
/// sequence recomputed). `shaders/sample.wgsl` computes the same with u32 pairs.
pub fn counter_u24(seed: u64, counter: u32) -> u32 {
    (mix64(seed.wrapping_add((counter as u64 + 1).wrapping_mul(GAMMA))) >> 40) as u32
}

#[derive(Clone, Debug)]
pub struct Rng {
    state: u64,
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng { state: seed ^ GAMMA }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GAMMA);
        mix64(self.state)
    }
}

/// Test data: the shipped library samples through [`counter_u24`] alone, so these are built only
/// for tests (the `testing` feature, or this crate's own unit tests).
#[cfg(any(test, feature = "testing"))]
impl Rng {
    /// Uniform in [0, 1).
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    pub fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * self.next_f32()
    }

    /// Uniform integer in [0, n); n must be > 0.
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Approximately standard normal (sum of uniforms), enough for test data.
    pub fn normal(&mut self) -> f32 {
        let s: f32 = (0..12).map(|_| self.next_f32()).sum();
        s - 6.0
    }

    /// `n` values uniform in [lo, hi).
    pub fn vec_uniform(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform(lo, hi)).collect()
    }
}
