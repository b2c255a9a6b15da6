//! Shared helpers: seeded clustered unit vectors like `shared/bench/gen_data.py`.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use cairn_core::{MemoryKind, NewMemory, Role, ThreadId};
use cairn_store::{Store, StoreOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, LogNormal, StandardNormal};

pub const DIM: usize = 384;

pub fn unit(mut v: Vec<f32>) -> Vec<f32> {
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    for x in &mut v {
        *x /= n;
    }
    v
}

/// Clustered, anisotropic unit vectors (a mixture of Gaussians with unequal sizes and a
/// shared mean direction), like `gen_data.py` draws them.
pub struct Clusters {
    rng: StdRng,
    centers: Vec<Vec<f32>>,
    sigma: Vec<f32>,
    weights: Vec<f64>,
    scale: Vec<f32>,
    dim: usize,
}

impl Clusters {
    pub fn new(seed: u64, dim: usize, k: usize) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        // Power-law spectrum along the axes (a random rotation does not change neighbours).
        let mut scale: Vec<f32> = (0..dim).map(|i| ((i + 1) as f32).powf(-0.3)).collect();
        let norm = scale.iter().map(|s| s * s).sum::<f32>().sqrt();
        for s in &mut scale {
            *s /= norm;
        }
        let mu = unit(
            (0..dim)
                .map(|_| rng.sample::<f32, _>(StandardNormal))
                .collect(),
        );
        let mut centers = Vec::with_capacity(k);
        for _ in 0..k {
            let noise = unit(
                (0..dim)
                    .map(|i| rng.sample::<f32, _>(StandardNormal) * scale[i])
                    .collect(),
            );
            centers.push(unit(
                mu.iter().zip(&noise).map(|(m, n)| 0.35 * m + n).collect(),
            ));
        }
        let ln = LogNormal::new(0.0, 0.8).unwrap();
        let weights: Vec<f64> = (0..k).map(|_| ln.sample(&mut rng)).collect();
        let sigma = (0..k).map(|_| rng.random_range(0.55..1.0)).collect();
        Self {
            rng,
            centers,
            sigma,
            weights,
            scale,
            dim,
        }
    }

    pub fn draw(&mut self) -> Vec<f32> {
        let total: f64 = self.weights.iter().sum();
        let mut pick = self.rng.random_range(0.0..total);
        let mut c = 0;
        for (i, w) in self.weights.iter().enumerate() {
            if pick < *w {
                c = i;
                break;
            }
            pick -= w;
        }
        let s = self.sigma[c];
        let v = (0..self.dim)
            .map(|i| {
                self.centers[c][i] + s * self.rng.sample::<f32, _>(StandardNormal) * self.scale[i]
            })
            .collect();
        unit(v)
    }
}

pub fn options(dim: usize) -> StoreOptions {
    StoreOptions::new("test-model", dim)
}

pub fn turn(thread: &str, i: usize) -> NewMemory {
    NewMemory::conversational(
        ThreadId::new(thread).unwrap(),
        if i.is_multiple_of(2) {
            Role::User
        } else {
            Role::Assistant
        },
        format!("turn {i} of {thread}"),
    )
}

pub fn knowledge(text: &str) -> NewMemory {
    NewMemory::new(MemoryKind::Knowledge, text)
}

pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// A random unit vector.
pub fn random_unit(rng: &mut StdRng, dim: usize) -> Vec<f32> {
    unit(
        (0..dim)
            .map(|_| rng.sample::<f32, _>(StandardNormal))
            .collect(),
    )
}

pub fn open(path: &std::path::Path, dim: usize) -> Store {
    Store::open(path, options(dim)).unwrap()
}
