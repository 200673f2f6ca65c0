//! A small deterministic generator (xorshift64*) for the randomized tests, so
//! that a failing run can be replayed from the seed it prints.

use std::time::Duration;

pub struct Rng(pub u64);

impl Rng {
    /// Seeded from CASCADE_GUARD_SEED, or the clock; prints the seed.
    pub fn from_env(test: &str) -> Self {
        let seed = std::env::var("CASCADE_GUARD_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(1)
            })
            | 1;
        eprintln!("{test}: seed {seed} (replay with CASCADE_GUARD_SEED={seed})");
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    pub fn chance(&mut self, one_in: u64) -> bool {
        self.below(one_in) == 0
    }

    pub fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi - lo + 1))
    }
}
