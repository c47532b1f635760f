//! YCSB's key distributions: zipfian (Gray et al., "Quickly generating
//! billion-record synthetic databases", as in YCSB's ZipfianGenerator) with
//! the popular items scrambled over the key space (ScrambledZipfianGenerator),
//! and uniform.

use rand::Rng;

/// Zipfian ranks over `items` with skew `theta` (YCSB uses 0.99).
#[derive(Clone, Debug)]
pub struct Zipfian {
    items: u64,
    theta: f64,
    zeta_n: f64,
    alpha: f64,
    eta: f64,
}

fn zeta(n: u64, theta: f64) -> f64 {
    (1..=n).map(|i| 1.0 / (i as f64).powf(theta)).sum()
}

impl Zipfian {
    /// A generator of ranks in `0..items`, rank 0 the most popular.
    pub fn new(items: u64, theta: f64) -> Self {
        assert!(items >= 2, "a zipfian needs at least two items");
        assert!(theta > 0.0 && theta < 1.0, "theta must be in (0, 1)");
        let zeta_n = zeta(items, theta);
        let zeta2 = zeta(2, theta);
        let alpha = 1.0 / (1.0 - theta);
        let eta = (1.0 - (2.0 / items as f64).powf(1.0 - theta)) / (1.0 - zeta2 / zeta_n);
        Self {
            items,
            theta,
            zeta_n,
            alpha,
            eta,
        }
    }

    /// The next rank.
    pub fn next_rank(&self, rng: &mut impl Rng) -> u64 {
        let u: f64 = rng.gen();
        let uz = u * self.zeta_n;
        if uz < 1.0 {
            return 0;
        }
        if uz < 1.0 + 0.5f64.powf(self.theta) {
            return 1;
        }
        let r = (self.items as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64;
        r.min(self.items - 1)
    }
}

/// FNV-1a of a 64-bit value: YCSB's scrambling hash.
fn fnv64(mut x: u64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for _ in 0..8 {
        h ^= x & 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
        x >>= 8;
    }
    h
}

/// Which key an operation touches.
#[derive(Clone, Debug)]
pub enum KeyChooser {
    /// Zipfian ranks scattered over the key space.
    ScrambledZipfian(Zipfian),
    /// Every key equally likely.
    Uniform(u64),
}

impl KeyChooser {
    /// The next key index in `0..items`.
    pub fn next_key(&self, rng: &mut impl Rng) -> u64 {
        match self {
            KeyChooser::ScrambledZipfian(z) => fnv64(z.next_rank(rng)) % z.items,
            KeyChooser::Uniform(n) => rng.gen_range(0..*n),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    #[test]
    fn zipfian_ranks_follow_the_power_law() {
        let z = Zipfian::new(10_000, 0.99);
        let mut rng = SmallRng::seed_from_u64(1);
        let mut counts = vec![0u64; 10_000];
        let n = 200_000;
        for _ in 0..n {
            counts[z.next_rank(&mut rng) as usize] += 1;
        }
        // P(rank 0) = 1 / zeta(n): about 10% for 10k items at theta 0.99.
        let p0 = counts[0] as f64 / n as f64;
        let expect = 1.0 / zeta(10_000, 0.99);
        assert!((p0 - expect).abs() < 0.01, "p0 {p0:.4} vs {expect:.4}");
        // Rank 1 about p0 / 2^0.99; the top 1% of ranks take well over a third.
        let ratio = counts[0] as f64 / counts[1] as f64;
        assert!((1.8..2.2).contains(&ratio), "rank 0/1 ratio {ratio:.2}");
        let top: u64 = counts[..100].iter().sum();
        assert!(top as f64 / n as f64 > 0.35);
    }

    #[test]
    fn scrambling_spreads_hot_keys_and_uniform_is_flat() {
        let mut rng = SmallRng::seed_from_u64(2);
        let c = KeyChooser::ScrambledZipfian(Zipfian::new(1000, 0.99));
        let keys: Vec<u64> = (0..10_000).map(|_| c.next_key(&mut rng)).collect();
        assert!(keys.iter().all(|&k| k < 1000));
        let hottest = *keys
            .iter()
            .max_by_key(|&&k| keys.iter().filter(|&&x| x == k).count())
            .unwrap();
        assert_ne!(hottest, 0, "the hottest key is not the first one");
        let u = KeyChooser::Uniform(4);
        let mut hist = [0; 4];
        for _ in 0..40_000 {
            hist[u.next_key(&mut rng) as usize] += 1;
        }
        assert!(
            hist.iter().all(|&h| (9_000..11_000).contains(&h)),
            "{hist:?}"
        );
    }
}
