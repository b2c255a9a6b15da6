use std::path::PathBuf;

use cairn_core::{InputError, MemoryId};
use thiserror::Error;

/// The error a model gives [`crate::Store::reembed`]: any error type (`"text".into()` or
/// `Box::new(e)`); it comes back as the source of [`StoreError::Embedding`].
pub type ModelError = Box<dyn std::error::Error + Send + Sync>;

/// Errors of the store. Every failed write leaves the database as it was.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum StoreError {
    /// Bad input (empty text, a bad vector, a bad thread id, ...).
    #[error(transparent)]
    Input(#[from] InputError),
    /// No memory has this id.
    #[error("no memory with id {id}")]
    NotFound {
        /// The unknown id.
        id: MemoryId,
    },
    /// The memory exists but is not a summary.
    #[error("memory {id} is not a summary")]
    NotASummary {
        /// The id.
        id: MemoryId,
    },
    /// A memory with this id already exists.
    #[error("a memory with id {id} already exists")]
    DuplicateId {
        /// The id.
        id: MemoryId,
    },
    /// A summary was given no sources.
    #[error("a summary needs at least one source")]
    EmptySources,
    /// A summary lists the same source twice.
    #[error("source {id} is listed more than once")]
    DuplicateSource {
        /// The repeated id.
        id: MemoryId,
    },
    /// A summary cites itself.
    #[error("summary {id} cannot cite itself")]
    SelfReference {
        /// The summary.
        id: MemoryId,
    },
    /// A summary would cite one of its own ancestors.
    #[error("linking {summary} to {ancestor} would make a cycle ({ancestor} already summarizes {summary})")]
    Cycle {
        /// The summary.
        summary: MemoryId,
        /// The proposed source, already an ancestor of the summary.
        ancestor: MemoryId,
    },
    /// `Restrict` refused a delete because summaries cite the memory.
    #[error("memory {id} is cited by {} summaries; delete them first or use the Cascade or Detach policy", summaries.len())]
    CitedBySummaries {
        /// The memory that was not deleted.
        id: MemoryId,
        /// The summaries that cite it.
        summaries: Vec<MemoryId>,
    },
    /// The database was made with another embedding model (or was re-embedded with another
    /// one since this handle opened it).
    #[error("the store is on model {stored_model:?} ({stored_dim} dimensions), not {requested_model:?} ({requested_dim} dimensions); open it with that model, or re-embed it")]
    ModelMismatch {
        /// Model id in the database.
        stored_model: String,
        /// Dimension in the database.
        stored_dim: usize,
        /// Model id asked for.
        requested_model: String,
        /// Dimension asked for.
        requested_dim: usize,
    },
    /// A summary of one thread was given a source from another thread; nothing written.
    #[error("memory {id} belongs to thread {source_thread:?}; a summary of thread {summary_thread:?} cannot cite it")]
    ThreadMismatch {
        /// The source from another thread.
        id: MemoryId,
        /// Its thread.
        source_thread: String,
        /// The summary's thread.
        summary_thread: String,
    },
    /// A memory cannot supersede this one: it is a summary, already superseded, or the
    /// memory itself.
    #[error("memory {id} cannot be superseded: {reason}")]
    CannotSupersede {
        /// The earlier memory.
        id: MemoryId,
        /// Why.
        reason: &'static str,
    },
    /// The database was written by a newer Cairn.
    #[error("the database format version is {found}, newer than the {supported} this build reads; upgrade Cairn")]
    FormatTooNew {
        /// Version found.
        found: i64,
        /// Highest version this build reads.
        supported: i64,
    },
    /// The file is not a Cairn database (or is damaged beyond SQLite's own recovery).
    #[error("{} is not a readable Cairn database: {message}", path.display())]
    NotADatabase {
        /// The file.
        path: PathBuf,
        /// What SQLite said.
        message: String,
    },
    /// The disk is full: nothing was written; free space and retry.
    #[error("the disk is full; nothing was written (free space and retry)")]
    DiskFull,
    /// A configuration value is out of range.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The model failed while re-embedding the store ([`crate::Store::reembed`]): it
    /// returned an error or the wrong number of vectors. The store is still on its model,
    /// every vector as it was.
    #[error("re-embedding failed: {reason}; the store is unchanged")]
    Embedding {
        /// What the model said, or what was wrong with its answer.
        reason: String,
        /// The model's own error (`None` when its answer was wrong: too few vectors).
        #[source]
        source: Option<ModelError>,
    },
    /// The writer thread has stopped (it panicked or the store is closing).
    #[error("the store's writer thread has stopped")]
    WriterGone,
    /// An SQLite error not covered above.
    #[error("sqlite: {0}")]
    Sqlite(rusqlite::Error),
    /// An error of a database server backend (PostgreSQL): connection, query or pool.
    #[error("{backend}: {message}")]
    Backend {
        /// The backend (`"postgres"`).
        backend: &'static str,
        /// What the server or driver said.
        message: String,
    },
    /// The backend does not do this (yet); nothing was written.
    #[error("the {backend} backend does not support {what}")]
    Unsupported {
        /// The backend.
        backend: &'static str,
        /// What was asked.
        what: &'static str,
    },
    /// An I/O error (index snapshot files).
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        if let rusqlite::Error::SqliteFailure(f, _) = &e {
            if f.code == rusqlite::ErrorCode::DiskFull {
                return StoreError::DiskFull;
            }
        }
        StoreError::Sqlite(e)
    }
}

/// Result with [`StoreError`].
pub type Result<T, E = StoreError> = std::result::Result<T, E>;
