//! Core types and traits of Cairn, a hierarchical, vector-backed memory store for LLM agents.
//!
//! This crate holds what every other Cairn crate shares and nothing heavy:
//!
//! * identifiers: [`MemoryId`] (public, UUID v7) and [`ThreadId`] (validated text);
//! * the data model: [`MemoryKind`], [`Role`], [`MemoryUnit`], [`SummaryInfo`], [`SummaryType`],
//!   and the input record [`NewMemory`];
//! * the seams: [`Embedder`] (text to unit vectors, blocking), [`Summarizer`] (async),
//!   [`TokenCounter`] and [`Clock`], each with a small implementation usable in tests;
//! * the error types those seams return.
//!
//! A memory is a row: content, kind, optional thread and role, creation time, JSON metadata,
//! and a level (0 for raw memories, 1 + the highest source level for summaries).
//!
//! ```
//! use cairn_core::{MemoryId, MemoryKind, NewMemory, Role, ThreadId};
//!
//! let thread = ThreadId::new("chat-123")?;
//! let turn = NewMemory::conversational(thread, Role::User, "What is the GIL?");
//! assert_eq!(turn.kind, MemoryKind::Conversational);
//! let id = MemoryId::new();
//! assert_eq!(id.to_string().parse::<MemoryId>()?, id);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod clock;
mod error;
mod id;
mod kind;
mod memory;
mod traits;

pub use clock::{Clock, ManualClock, SystemClock};
pub use error::{EmbedError, InputError, SummarizeError};
pub use id::{MemoryId, ThreadId, MAX_THREAD_ID_LEN};
pub use kind::{MemoryKind, Role, SummaryType};
pub use memory::{
    check_metadata, Lifetime, MemoryUnit, Metadata, NewMemory, SummaryInfo, MAX_CONTENT_BYTES,
    SPEAKER_KEY,
};
pub use traits::{
    CharEstimateCounter, Embedder, Summarizer, SummaryItem, SummaryRequest, TermStats, TokenCounter,
};

/// Checks that a vector is usable as an embedding of dimension `dim`: the right length and
/// only finite values.
pub fn validate_vector(vector: &[f32], dim: usize) -> Result<(), InputError> {
    if vector.len() != dim {
        return Err(InputError::DimensionMismatch {
            expected: dim,
            got: vector.len(),
        });
    }
    if let Some(position) = vector.iter().position(|x| !x.is_finite()) {
        return Err(InputError::NonFiniteVector { position });
    }
    Ok(())
}

/// The L2 norm `normalized` divides by; a vector whose norm is zero (or not finite) is an
/// error.
pub fn unit_norm(vector: &[f32]) -> Result<f32, InputError> {
    let norm = vector.iter().map(|x| x * x).sum::<f32>().sqrt();
    if !norm.is_finite() || norm == 0.0 {
        return Err(InputError::ZeroVector);
    }
    Ok(norm)
}

/// Returns `vector` scaled to unit L2 norm; an all-zero vector is an error.
pub fn normalized(mut vector: Vec<f32>) -> Result<Vec<f32>, InputError> {
    let norm = unit_norm(&vector)?;
    for x in &mut vector {
        *x /= norm;
    }
    Ok(vector)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectors_are_checked() {
        assert!(validate_vector(&[0.0, 1.0], 2).is_ok());
        assert_eq!(
            validate_vector(&[0.0], 2),
            Err(InputError::DimensionMismatch {
                expected: 2,
                got: 1
            })
        );
        assert_eq!(
            validate_vector(&[0.0, f32::NAN], 2),
            Err(InputError::NonFiniteVector { position: 1 })
        );
        assert_eq!(
            validate_vector(&[f32::INFINITY, 0.0], 2),
            Err(InputError::NonFiniteVector { position: 0 })
        );
        assert_eq!(normalized(vec![0.0, 0.0]), Err(InputError::ZeroVector));
        let v = normalized(vec![3.0, 4.0]).unwrap();
        assert!((v[0] - 0.6).abs() < 1e-6 && (v[1] - 0.8).abs() < 1e-6);
    }
}
