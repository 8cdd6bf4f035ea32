//! Named, seeded random streams.
//!
//! A run has one master seed. Each consumer (the dataset sampler, the sampler
//! of agent k, the scripted coach's noise, ...) draws from its own stream,
//! derived from the master seed and the stream's name by sha256. Streams are
//! therefore independent of one another and of the order in which they are
//! created: adding a new stream never shifts the numbers of an existing one.
//!
//! Streams are ChaCha8 generators; their full state (seed and position) can be
//! saved and restored, so a resumed run continues with the exact numbers an
//! uninterrupted one would have drawn.

use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use sha2::{Digest, Sha256};

/// The root of a run's random streams: a master seed from which named streams derive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeedTree {
    master: u64,
}

impl SeedTree {
    /// A tree rooted at `master`.
    pub fn new(master: u64) -> Self {
        Self { master }
    }

    /// The master seed.
    pub fn master(&self) -> u64 {
        self.master
    }

    /// The stream called `name`. The same (master, name) always gives the same stream.
    pub fn stream(&self, name: &str) -> RngStream {
        let mut hasher = Sha256::new();
        hasher.update(b"mappa-rng-stream\0");
        hasher.update(self.master.to_le_bytes());
        hasher.update(name.as_bytes());
        let seed: [u8; 32] = hasher.finalize().into();
        RngStream::from_seed_bytes(seed)
    }
}

/// One named random stream.
#[derive(Debug, Clone)]
pub struct RngStream {
    seed: [u8; 32],
    rng: ChaCha8Rng,
}

/// The serialisable state of an [`RngStream`]: its seed and how far it has advanced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RngState {
    /// The 32-byte ChaCha seed.
    pub seed: [u8; 32],
    /// The generator's position in 32-bit words.
    pub word_pos: u128,
}

impl RngStream {
    /// A stream seeded directly from a `u64` (tests and one-off tools; runs use [`SeedTree`]).
    pub fn from_u64(seed: u64) -> Self {
        SeedTree::new(seed).stream("")
    }

    fn from_seed_bytes(seed: [u8; 32]) -> Self {
        Self {
            seed,
            rng: ChaCha8Rng::from_seed(seed),
        }
    }

    /// The next 32 random bits.
    pub fn next_u32(&mut self) -> u32 {
        self.rng.next_u32()
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.rng.next_u64()
    }

    /// A uniform draw from `[0, 1)` with 53 bits of precision.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// A uniform integer in `0..n` (without modulo bias). Panics when `n == 0`.
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "RngStream::below needs n > 0");
        let zone = u64::MAX - (u64::MAX - n + 1) % n;
        loop {
            let x = self.next_u64();
            if x <= zone {
                return x % n;
            }
        }
    }

    /// A standard normal draw (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.uniform(); // (0, 1]
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// The full state, to save in a checkpoint.
    pub fn state(&self) -> RngState {
        RngState {
            seed: self.seed,
            word_pos: self.rng.get_word_pos(),
        }
    }

    /// Restores a stream saved with [`RngStream::state`].
    pub fn from_state(state: RngState) -> Self {
        let mut stream = Self::from_seed_bytes(state.seed);
        stream.rng.set_word_pos(state.word_pos);
        stream
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_name_same_numbers() {
        let a: Vec<u64> = (0..4)
            .map({
                let mut s = SeedTree::new(42).stream("sampler/solver");
                move |_| s.next_u64()
            })
            .collect();
        let mut s = SeedTree::new(42).stream("sampler/solver");
        let b: Vec<u64> = (0..4).map(|_| s.next_u64()).collect();
        assert_eq!(a, b);
    }

    #[test]
    fn names_and_masters_separate_streams() {
        let x = SeedTree::new(42).stream("a").next_u64();
        assert_ne!(x, SeedTree::new(42).stream("b").next_u64());
        assert_ne!(x, SeedTree::new(43).stream("a").next_u64());
    }

    #[test]
    fn state_round_trip_continues_exactly() {
        let mut s = SeedTree::new(7).stream("data");
        for _ in 0..13 {
            s.next_u32();
        }
        let mut restored = RngStream::from_state(s.state());
        for _ in 0..10 {
            assert_eq!(s.next_u64(), restored.next_u64());
        }
    }

    #[test]
    fn uniform_and_below_stay_in_range() {
        let mut s = RngStream::from_u64(1);
        for _ in 0..10_000 {
            let u = s.uniform();
            assert!((0.0..1.0).contains(&u));
            assert!(s.below(7) < 7);
        }
    }

    #[test]
    fn normal_has_plausible_moments() {
        let mut s = RngStream::from_u64(3);
        let xs: Vec<f64> = (0..20_000).map(|_| s.normal()).collect();
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / xs.len() as f64;
        assert!(mean.abs() < 0.03, "mean {mean}");
        assert!((var - 1.0).abs() < 0.05, "var {var}");
    }
}
