//! The storage engine of Cairn: SQLite rows (the source of truth) and an HNSW index derived
//! from them.
//!
//! * Every memory is a row of `memories` with its embedding (f32 little-endian BLOB); its
//!   keyword-index row (FTS5) and summary links (`summary_sources(summary, source,
//!   position)`) are written in the same transaction.
//! * One writer thread owns the write connection and takes jobs over a bounded channel;
//!   reads use a pool of read-only connections (WAL mode). [`Store`] is a cheap, `Send +
//!   Sync` handle; every method blocks.
//! * The HNSW index (hnsw_rs, dot product on unit vectors) is updated after each commit and
//!   snapshotted beside the database in `<db>.hnsw/` with a manifest. Opening loads the
//!   snapshot and catches up from SQLite; a missing, damaged or mismatched snapshot is
//!   rebuilt from the stored embeddings. Deletions are tombstones until a rebuild.
//! * Filtered searches run the filter inside the graph traversal, or scan the admitted rows
//!   exactly when the filter admits few of them.
//!
//! ```
//! use cairn_core::{MemoryKind, NewMemory, Role, ThreadId};
//! use cairn_store::{Filter, NewSummary, Store, StoreOptions};
//!
//! let dir = tempfile::tempdir()?;
//! let store = Store::open(dir.path().join("m.db"), StoreOptions::new("demo-model", 3))?;
//! let t = ThreadId::new("chat-1")?;
//! let a = store.insert(NewMemory::conversational(t.clone(), Role::User, "hello"), vec![1.0, 0.0, 0.0])?;
//! let b = store.insert(NewMemory::conversational(t.clone(), Role::Assistant, "hi!"), vec![0.0, 1.0, 0.0])?;
//! let s = store.add_summary(NewSummary::new("greetings", vec![a.id, b.id]), vec![0.7, 0.7, 0.0])?;
//! assert_eq!(s.level, 1);
//! let sources = store.sources(s.id)?;
//! assert_eq!(sources.iter().map(|m| m.id).collect::<Vec<_>>(), vec![a.id, b.id]);
//! let hits = store.search_vector(vec![1.0, 0.1, 0.0], 1, &Filter::all().kinds([MemoryKind::Conversational]), None)?;
//! assert_eq!(hits[0].memory.id, a.id);
//! store.close()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod backend;
#[cfg(feature = "conformance")]
pub mod conformance;
mod error;
pub mod hnsw;
mod index;
mod options;
mod rows;
mod schema;
mod store;

pub use backend::MemoryBackend;
pub use error::{ModelError, Result, StoreError};
pub use index::{snapshot_dir, IndexHealth, Manifest, SnapshotLock, SNAPSHOT_FORMAT};
pub use options::{DeletePolicy, HnswParams, StoreOptions};
pub use rows::{Filter, MetaFilter, MAX_META_KEY_BYTES, MAX_META_SET};
pub use schema::SCHEMA_VERSION;
pub use store::{
    Cursor, DeleteReport, ForgetLock, ForgetMark, Hit, IndexCheck, NewSummary, Page, PendingForget,
    Store, StoreStats, ThreadState, TimelineEntry,
};
