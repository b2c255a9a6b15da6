//! Seeded vector data shared by the store's benches.

use rand::rngs::StdRng;
use rand::Rng;
use rand_distr::StandardNormal;

/// Embedding dimension of the benches (MiniLM's).
pub const DIM: usize = 384;

/// `v` scaled to unit length.
pub fn unit(mut v: Vec<f32>) -> Vec<f32> {
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.iter_mut().for_each(|x| *x /= n);
    v
}

/// Unit vectors drawn around `k` random unit centres with Gaussian spread `spread`.
pub struct Clusters {
    centers: Vec<Vec<f32>>,
    spread: f32,
}

impl Clusters {
    /// `k` centres drawn from `rng`.
    pub fn new(rng: &mut StdRng, k: usize, spread: f32) -> Self {
        let centers = (0..k)
            .map(|_| {
                unit(
                    (0..DIM)
                        .map(|_| rng.sample::<f32, _>(StandardNormal))
                        .collect(),
                )
            })
            .collect();
        Self { centers, spread }
    }

    /// One vector near a random centre.
    pub fn draw(&self, rng: &mut StdRng) -> Vec<f32> {
        let c = &self.centers[rng.random_range(0..self.centers.len())];
        unit(
            c.iter()
                .map(|x| x + self.spread * rng.sample::<f32, _>(StandardNormal))
                .collect(),
        )
    }
}

/// The sizes a bench runs at: `CAIRN_BENCH_SIZES` (comma-separated), else `default`.
#[allow(dead_code)] // (benches of one size include this module too)
pub fn sizes(default: &str) -> Vec<usize> {
    std::env::var("CAIRN_BENCH_SIZES")
        .unwrap_or_else(|_| default.into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect()
}
