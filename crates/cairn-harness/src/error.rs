use cairn_core::{EmbedError, InputError, MemoryId, SummarizeError};
use cairn_store::StoreError;
use thiserror::Error;

/// Errors of the harness.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum HarnessError {
    /// No memory has this id.
    #[error("no memory with id {id}")]
    NotFound {
        /// The unknown id.
        id: MemoryId,
    },
    /// Bad input; nothing was written.
    #[error(transparent)]
    Input(#[from] InputError),
    /// A storage error (link validation, delete policy, model identity, I/O, ...).
    #[error(transparent)]
    Store(StoreError),
    /// The embedder failed.
    #[error(transparent)]
    Embed(#[from] EmbedError),
    /// The summarizer failed; no memory was changed.
    #[error(transparent)]
    Summarize(#[from] SummarizeError),
    /// A configuration value is invalid.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A background task could not finish (the runtime is shutting down).
    #[error("background task failed: {0}")]
    Task(String),
}

impl From<StoreError> for HarnessError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound { id } => HarnessError::NotFound { id },
            StoreError::Input(i) => HarnessError::Input(i),
            other => HarnessError::Store(other),
        }
    }
}

/// Result with [`HarnessError`].
pub type Result<T, E = HarnessError> = std::result::Result<T, E>;
