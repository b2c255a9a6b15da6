//! [`HashEmbedder`]: deterministic vectors for logic tests. Not a model.

use cairn_core::{EmbedError, Embedder, InputError};
use sha2::{Digest, Sha256};

/// Deterministic, **meaningless** vectors: each lower-cased word is hashed to a few signed
/// positions (feature hashing) and the sum is normalised. Texts sharing words get similar
/// vectors; synonyms and paraphrases do not. It exists so logic tests run without the
/// model; nothing that depends on meaning may be tested with it, and no default build path
/// uses it (it is behind the `testing` feature).
#[derive(Debug, Clone)]
pub struct HashEmbedder {
    dim: usize,
}

impl HashEmbedder {
    /// A hash embedder of `dim` dimensions (at least 8).
    pub fn new(dim: usize) -> Self {
        Self { dim: dim.max(8) }
    }
}

impl Embedder for HashEmbedder {
    fn model_id(&self) -> &str {
        "hash-embedder-testing-only"
    }

    fn dim(&self) -> usize {
        self.dim
    }

    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        texts
            .iter()
            .map(|t| {
                if t.trim().is_empty() {
                    return Err(InputError::EmptyContent.into());
                }
                let mut v = vec![0f32; self.dim];
                for word in t
                    .split(|c: char| !c.is_alphanumeric())
                    .filter(|w| !w.is_empty())
                {
                    let d = Sha256::digest(word.to_lowercase().as_bytes());
                    for k in 0..4 {
                        let idx = u32::from_le_bytes([
                            d[4 * k],
                            d[4 * k + 1],
                            d[4 * k + 2],
                            d[4 * k + 3],
                        ]);
                        let pos = usize::try_from(idx).unwrap_or(0) % self.dim;
                        v[pos] += if d[16 + k] & 1 == 0 { 1.0 } else { -1.0 };
                    }
                }
                // Text with no words (punctuation only) still gets a vector.
                if v.iter().all(|x| *x == 0.0) {
                    let d = Sha256::digest(t.as_bytes());
                    v[usize::from(d[0]) % self.dim] = 1.0;
                }
                cairn_core::normalized(v).map_err(EmbedError::from)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_unit_vectors() {
        let e = HashEmbedder::new(64);
        let a = e.embed(&["the cat sat", "the cat sat", "?!"]).unwrap();
        assert_eq!(a[0], a[1]);
        for v in &a {
            let n: f32 = v.iter().map(|x| x * x).sum();
            assert!((n - 1.0).abs() < 1e-5);
        }
        assert!(e.embed(&[" "]).is_err());
    }
}
